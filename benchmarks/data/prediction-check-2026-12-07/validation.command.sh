#!/bin/bash
# issue 63: the unpruned model's answers on the 4096-token studies' calibration records (validation
# split, the presets' --confirm-n-examples per dataset as the LongBench QA runs cut them: 3 for qa-4k,
# 8 for openqa-4k), so that the score's bound the certified bound now reads (ff95ee0) can be computed
# for the committed picks; prediction_check.py --validation reads them.
cd "$(git rev-parse --show-toplevel)"
D=benchmarks/data/prediction-check-2026-12-07
.venv/bin/python -m tuner.evaluate --task qa --split validation --n-examples 3 --max-prompt-tokens 4096 \
  --max-new-tokens 32 --dtype bfloat16 --data-dir /work/shared/data/longbench --methods baseline \
  --timing-rounds 1 --output /work/i63run/val-qa-4k
cp /work/i63run/val-qa-4k/baseline.jsonl $D/validation.qa-4k.baseline.jsonl
.venv/bin/python -m tuner.evaluate --task openqa --split validation --n-examples 8 --max-prompt-tokens 4096 \
  --max-new-tokens 32 --dtype bfloat16 --openqa-dir /work/shared/data/open-qa --methods baseline \
  --timing-rounds 1 --output /work/i63run/val-openqa-4k
cp /work/i63run/val-openqa-4k/baseline.jsonl $D/validation.openqa-4k.baseline.jsonl
