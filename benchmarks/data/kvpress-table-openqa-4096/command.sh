#!/bin/bash
# issue 63: the peers' table at 4096 tokens; the openqa-4k preset's seed 0 pick (re-decided, trial 3) against
# the paper's default, GemFilter and TSP (published and at the pick's speed) and kvpress's presses at the
# pick's KV memory, on the 200 open-QA test questions its n=200 evaluation used. Resumable: rerun to go on.
cd /work/main
d=benchmarks/data/kvpress-table-openqa-4096
echo "start $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) load $(cut -d' ' -f1-3 /proc/loadavg)"
.venv/bin/python benchmarks/kvpress_table.py --openqa-dir /work/shared/data/open-qa --n 200 \
  --pick benchmarks/data/long-prompts-2026-12-06/openqa-4k-seed0-redecided/recommended.json \
  --max-prompt-tokens 4096 --dtype bfloat16 --press-ratios pick --threads 2 --timing-rounds 3 \
  --out $d/rows.jsonl --cache /work/i63run/kvpress-4096-cache "$@"
echo "end $(date -u +%FT%TZ) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)"
