#!/bin/bash
# issue 63 (tenth session, 7dbe54a: the deciding bound read at the unpruned score's bound): the 4096-token LongBench QA preset (qa-4k: single-doc + multi-doc QA, 6 English datasets,
# records cut in the middle to 4096 tokens), seed 2, with counts cut to fit a session (per dataset:
# 2 searched at 1024 tokens, 3 calibrated at 4096, 4 fresh open-QA prompts, 1 held-out test example)
# and 480 s of trials, on an idle 2-core CPU. The pick's real check is tuner.evaluate on LongBench test
# records at 4096 tokens (test.command.sh).
cd /work/main
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.search --preset qa-4k --seed 2 \
  --data-dir /work/shared/data/longbench --openqa-dir /work/shared/data/open-qa \
  --output /work/i63run/runs --study-name qa-4k-seed2-score-bound \
  --n-examples 2 --confirm-n-examples 3 --fresh-kl-examples 4 --heldout-n-examples 1 \
  --trials-timeout 480 --timing-rounds 2
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
