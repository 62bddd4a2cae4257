#!/bin/bash
# issue 63: the predicted task loss of the LongBench 4096 picks decided by 4f5fba1's rule (the fresh-drift
# check runs however many examples the search ranked on) against their test loss, each and pooled on the
# 29 test records, beside the same three studies' picks under 7dbe54a's rule and before it. Reads
# committed files only (no model run).
cd "$(git rev-parse --show-toplevel)"
B=benchmarks/data/long-prompts-2026-12-06
.venv/bin/python benchmarks/prediction_check.py \
  qa-4k-s0=$B/qa-4k-seed0 qa-4k-s1=$B/qa-4k-seed1 qa-4k-s2=$B/qa-4k-seed2 \
  qa-4k-s0-sb=$B/qa-4k-seed0-score-bound qa-4k-s1-sb=$B/qa-4k-seed1-score-bound qa-4k-s2-sb=$B/qa-4k-seed2-score-bound \
  qa-4k-s0-fc=$B/qa-4k-seed0-fresh-check qa-4k-s1-fc=$B/qa-4k-seed1-fresh-check qa-4k-s2-fc=$B/qa-4k-seed2-fresh-check \
  --pool qa-4k-3seeds=qa-4k-s0,qa-4k-s1,qa-4k-s2 --pool qa-4k-3seeds-sb=qa-4k-s0-sb,qa-4k-s1-sb,qa-4k-s2-sb \
  --pool qa-4k-3seeds-fc=qa-4k-s0-fc,qa-4k-s1-fc,qa-4k-s2-fc \
  --draws 20000 --out-dir benchmarks/data/prediction-check-2026-12-07/fresh-check
