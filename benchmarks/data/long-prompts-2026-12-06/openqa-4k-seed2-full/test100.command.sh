#!/bin/bash
# issue 63: the full-length seed 2 pick on the same 100 open-QA test questions at 4096 tokens as
# the cheap search's pick (../openqa-4k-seed2/test100.*). The unpruned answers are read from that run's
# baseline cache (the same model, settings and questions: greedy answers do not change); both sides'
# TTFT are timed again, side by side, in this run.
cd /work/main
mkdir -p /work/i63run/eval-openqa-4k-seed2-full-test100
cp -r /work/i63run/eval-openqa-4k-seed2-test100/cache /work/i63run/eval-openqa-4k-seed2-full-test100/
start=$(date +%s)
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python -m tuner.evaluate --task openqa --split test --n-examples 50 --max-prompt-tokens 4096 \
  --dtype bfloat16 --openqa-dir /work/shared/data/open-qa --methods baseline,lazyllm \
  --schedule benchmarks/data/long-prompts-2026-12-06/openqa-4k-seed2-full/recommended.json \
  --output /work/i63run/eval-openqa-4k-seed2-full-test100
rc=$?
end=$(date +%s)
echo "end $(date -u +%FT%TZ) rc $rc wall $((end-start)) s load $(cut -d' ' -f1-3 /proc/loadavg)"
