#!/bin/bash
# issue 63: the current rule's quickstart pick at seed 0 on 200 open-QA test questions built to 1024 tokens
# (the quickstart's prompt length and dtype), a larger held-back check than LongBench's 29 test records;
# one timing round per side (TTFT here is secondary; the quickstart's held-out check timed 3)
cd /work/main
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.evaluate --task openqa --split test --n-examples 100 --max-prompt-tokens 1024 \
  --dtype float32 --openqa-dir /work/shared/data/open-qa --methods baseline,lazyllm --timing-rounds 1 \
  --schedule benchmarks/data/quickstart-2026-12-07/seed0/recommended.json \
  --output /work/i63run/eval-qs-seed0-openqa200
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
