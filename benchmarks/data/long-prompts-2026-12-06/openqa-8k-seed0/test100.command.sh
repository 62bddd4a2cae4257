#!/bin/bash
# issue 63: the openqa-8k seed 0 pick on 100 open-QA test questions at 8160 tokens (50 per dataset), 2 timing rounds per side (min per side)
cd /work/main
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.evaluate --task openqa --split test --n-examples 50 --max-prompt-tokens 8160 \
  --dtype bfloat16 --openqa-dir /work/shared/data/open-qa --methods baseline,lazyllm --timing-rounds 2 \
  --schedule benchmarks/data/long-prompts-2026-12-06/openqa-8k-seed0/recommended.json \
  --output /work/i63run/eval-openqa-8k-seed0-test100
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
