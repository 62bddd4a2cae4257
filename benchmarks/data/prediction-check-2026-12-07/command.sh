#!/bin/bash
# issue 63: did each long-prompt study's predicted task loss for its pick hold on test? Every committed
# study folder with a tuner.evaluate test run of its pick; pools of picks run on the same test records
# (open-QA at 4096: the four picks evaluated on the same 100 questions; LongBench QA at 4096 and at 8160:
# the three seeds' picks on the 29 test records). Reads committed files only (no model run); the
# 4096-token studies' certified bounds are also read again at the unpruned score's bound (ff95ee0) from
# the unpruned rows on their calibration records (validation.command.sh).
cd "$(git rev-parse --show-toplevel)"
B=benchmarks/data/long-prompts-2026-12-06
D=benchmarks/data/prediction-check-2026-12-07  # validation.*.jsonl: validation.command.sh
.venv/bin/python benchmarks/prediction_check.py \
  openqa-4k-s0=$B/openqa-4k-seed0-redecided openqa-4k-s1=$B/openqa-4k-seed1 openqa-4k-s2=$B/openqa-4k-seed2 \
  openqa-4k-s1-full=$B/openqa-4k-seed1-full openqa-4k-s2-full=$B/openqa-4k-seed2-full \
  openqa-8k-s0=$B/openqa-8k-seed0 \
  qa-4k-s0=$B/qa-4k-seed0 qa-4k-s1=$B/qa-4k-seed1 qa-4k-s2=$B/qa-4k-seed2 \
  qa-8k-s0-first=$B/qa-8k-seed0 qa-8k-s0=$B/qa-8k-seed0-redecided qa-8k-s1=$B/qa-8k-seed1 qa-8k-s2=$B/qa-8k-seed2 \
  --pool openqa-4k-100=openqa-4k-s1,openqa-4k-s2,openqa-4k-s1-full,openqa-4k-s2-full \
  --pool qa-4k-3seeds=qa-4k-s0,qa-4k-s1,qa-4k-s2 \
  --pool qa-8k-3seeds=qa-8k-s0,qa-8k-s1,qa-8k-s2 \
  --validation qa-4k-s0=$D/validation.qa-4k.baseline.jsonl --validation qa-4k-s1=$D/validation.qa-4k.baseline.jsonl \
  --validation qa-4k-s2=$D/validation.qa-4k.baseline.jsonl \
  --validation openqa-4k-s0=$D/validation.openqa-4k.baseline.jsonl --validation openqa-4k-s1=$D/validation.openqa-4k.baseline.jsonl \
  --validation openqa-4k-s2=$D/validation.openqa-4k.baseline.jsonl \
  --validation openqa-4k-s1-full=$D/validation.openqa-4k.baseline.jsonl \
  --validation openqa-4k-s2-full=$D/validation.openqa-4k.baseline.jsonl \
  --draws 20000 --out-dir $D
