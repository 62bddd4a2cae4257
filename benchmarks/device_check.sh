#!/usr/bin/env bash
# The prefill and generation benchmarks in bfloat16 on a lent CUDA machine, as one short script.
#
# Prepared here (the weights cannot travel: the machine takes 64 MiB), from the repository root:
#   mkdir -p .devbench/smollm2-135m .devbench/longbench && echo /.devbench/ >> .git/info/exclude
#   cp ~/.cache/lazyllm/smollm2-135m/hf/{config.json,generation_config.json,tokenizer*.json,chat_template.jinja} \
#      .devbench/smollm2-135m/
#   head -40 ../shared/data/longbench/multi_news.jsonl > .devbench/longbench/multi_news.jsonl
# then run there with .devbench carried: `bash benchmarks/device_check.sh`. On an H200 (2026-12-04) the
# prefill tables took about 5 minutes with the model builds; generation, at 128 new tokens and 3
# rounds, did not finish in the rest of a 570 s call, so it now runs 32 tokens, 2 rounds, one policy.
# Two random-init models (benchmarks/random_checkpoint.py): SmolLM2-135M's shape, the tuner's default,
# and Llama-3.1-8B's shape (SmolLM2's vocabulary), the size the LazyLLM paper timed. Tables (log.txt)
# and JSON go to $OUT (or ./device-out).
set -uo pipefail
out=${OUT:-device-out}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 LONGBENCH_DIR=$PWD/.devbench/longbench
py=${PYTHON:-python3}
log=$out/log.txt  # every table, in order; the JSON files beside it (the machine returns 8 files at most)
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$log"

bench() {  # name, prefill lengths, generation prompt tokens, --set overrides...
  local name=$1 lengths=$2 tokens=$3
  shift 3
  local model=/tmp/models/$name
  $py benchmarks/random_checkpoint.py --like .devbench/smollm2-135m --out "$model" "$@" 2>&1 | grep -v shards | tee -a "$log"
  # shellcheck disable=SC2086
  timeout 240 $py benchmarks/prefill_speed.py --model "$model" --lengths $lengths --rounds 5 \
    --dtypes bfloat16 --json "$out/prefill-$name.json" 2>&1 | grep -v "Loading weights" | tee -a "$log"
  timeout 150 $py benchmarks/generation_speed.py --model "$model" --tokens "$tokens" --new-tokens 32 \
    --rounds 2 --policies frozen --json "$out/generation-$name.json" 2>&1 \
    | grep -v "Loading weights" | tee -a "$log"
}

bench smollm2-135m-shape "2048 8192" 4096  # its context is 8192: prompt + answer must fit
bench llama-8b-shape "4096 16384 32768" 16384 --set hidden_size=4096 --set intermediate_size=14336 \
  --set num_hidden_layers=32 --set num_attention_heads=32 --set num_key_value_heads=8 --set head_dim=128 \
  --set max_position_embeddings=131072 --set tie_word_embeddings=false
