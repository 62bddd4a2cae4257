#!/bin/bash
# issue 63: the 4096-token open-QA preset, seed 2, with seed 0's cut counts (4/8/4/4 per dataset:
# 8 searched, 16 calibrated, 8 fresh prompts, 8 held-out test examples) and 480 s of trials, on an idle
# 2-core CPU. The pick's real check is tuner.evaluate on 100 test questions (test100.command.sh).
cd /work/main
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.search --preset openqa-4k --seed 2 \
  --openqa-dir /work/shared/data/open-qa --output /work/i63run/runs --study-name openqa-4k-seed2 \
  --n-examples 4 --confirm-n-examples 8 --fresh-kl-examples 4 --heldout-n-examples 4 \
  --trials-timeout 480 --timing-rounds 2
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
