#!/bin/bash
# The README's quickstart (`python -m tuner.search --task qa`: LongBench QA from the packaged records,
# 1024-token prompts, the default budget and trials) at seed 2, on the code of 743869b (the rule of 4f5fba1: 7dbe54a's
# deciding bound at the unpruned score's bound, and the fresh-drift check on every study), on an idle 2-core CPU.
cd /work/main
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.search --task qa --seed 2 --output /work/i63run/qs-runs-seed2
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
