#!/bin/bash
# issue 63, item 4: the 4096-token open-QA preset, seed 0, from the committed tree (1f6bb8b), cut to fit
# the session on a shared 2-core CPU (load 10-12 from other jobs): fewer examples than the preset.
cd /work/i63run
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit 1f6bb8b"
/work/main/.venv/bin/python -m tuner.search --preset openqa-4k --seed 0 \
  --openqa-dir /work/shared/data/open-qa --output /work/i63run/runs --study-name openqa-4k-seed0 \
  --n-examples 4 --confirm-n-examples 8 --fresh-kl-examples 4 --heldout-n-examples 4 \
  --trials-timeout 480 --timing-rounds 2
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s"
