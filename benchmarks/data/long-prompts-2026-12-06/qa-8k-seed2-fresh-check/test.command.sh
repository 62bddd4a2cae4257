#!/bin/bash
# issue 63: the qa-8k seed 2 pick decided again by 4f5fba1's rule (qa-8k-seed2-fresh-check) on LongBench QA test records at 8160 tokens: all 29 test records of the
# local copy (../shared/data/longbench holds 42 QA records in 6 datasets; --n-examples 10 caps none)
cd /work/main
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.evaluate --task qa --split test --n-examples 10 --max-prompt-tokens 8160 \
  --dtype bfloat16 --data-dir /work/shared/data/longbench --methods baseline,lazyllm \
  --schedule benchmarks/data/long-prompts-2026-12-06/qa-8k-seed2-fresh-check/recommended.json \
  --output /work/i63run/eval-qa-8k-seed2-fresh-check-test
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
