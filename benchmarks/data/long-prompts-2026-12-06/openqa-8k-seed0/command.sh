#!/bin/bash
# issue 63: the 8160-token open-QA preset (studies/openqa-8k.yaml: trials at 2048 tokens, everything
# after them at 8160), seed 0, on an idle 2-core CPU, with counts cut to fit the session (3 per dataset
# searched and scored again at 8160, 4 calibrated, 1 fresh, 2 held-out test examples; the preset's own are
# 8/12/4/3) and 420 s of trials. The pick's real check is tuner.evaluate on 100 test questions
# (test100.command.sh).
cd /work/main
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.search --preset openqa-8k --seed 0 \
  --openqa-dir /work/shared/data/open-qa --output /work/i63run/runs --study-name openqa-8k-seed0 \
  --n-examples 3 --confirm-n-examples 4 --fresh-kl-examples 1 --heldout-n-examples 2 \
  --trials-timeout 420 --timing-rounds 2
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
