#!/bin/bash
# issue 63: the predicted task loss of the LongBench 8160 picks decided by 4f5fba1's rule (7dbe54a's deciding
# bound and the fresh-drift check) against their test loss, each and pooled on the 29 test records, beside the
# same three studies' first picks. Seed 0's decision picked the schedule its first decision ran on test
# (qa-8k-seed0/): --test-rows reads those rows. Reads committed files only (no model run).
cd "$(git rev-parse --show-toplevel)"
B=benchmarks/data/long-prompts-2026-12-06
.venv/bin/python benchmarks/prediction_check.py \
  qa-8k-s0=$B/qa-8k-seed0-redecided qa-8k-s1=$B/qa-8k-seed1 qa-8k-s2=$B/qa-8k-seed2 \
  qa-8k-s0-fc=$B/qa-8k-seed0-fresh-check qa-8k-s1-fc=$B/qa-8k-seed1-fresh-check qa-8k-s2-fc=$B/qa-8k-seed2-fresh-check \
  --test-rows qa-8k-s0-fc=$B/qa-8k-seed0 \
  --pool qa-8k-3seeds=qa-8k-s0,qa-8k-s1,qa-8k-s2 --pool qa-8k-3seeds-fc=qa-8k-s0-fc,qa-8k-s1-fc,qa-8k-s2-fc \
  --draws 20000 --out-dir benchmarks/data/prediction-check-2026-12-07/fresh-check-8k
