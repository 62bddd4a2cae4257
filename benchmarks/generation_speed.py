"""Whole-generation speed of LazyLLM against the unpruned model: paired, interleaved timing.

    python benchmarks/generation_speed.py [--model smollm2-135m] [--tokens 2048] [--new-tokens 64] [--rounds 3]

A real LongBench context (multi_news) cut to ``--tokens`` tokens; exactly ``--new-tokens`` greedy
tokens (EOS ignored). Each round runs the unpruned engine and every schedule once, in shuffled order.
Reported per schedule: median paired TTFT speedup and total-generation speedup, decode ms/token
((total - TTFT) / (new tokens - 1)), share of prompt (token, layer) pairs computed over the whole
generation, and the Aux Cache high-water mark.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from pathlib import Path

import torch

from lazyllm import LazyLLM, Schedule, load_model
from lazyllm.engine import GenerationResult
from lazyllm.timing import paired_ratio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefill_speed import schedules


def prompt_ids(tokenizer: object, n: int) -> torch.Tensor:
    data = Path(
        os.environ.get("LONGBENCH_DIR", Path(__file__).resolve().parents[2] / "shared/data/longbench")
    )
    ids: list[int] = []
    with (data / "multi_news.jsonl").open() as fh:
        for line in fh:
            ids += tokenizer(json.loads(line)["context"])["input_ids"]  # type: ignore[operator]
            if len(ids) >= n:
                break
    return torch.tensor([ids[:n]])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    layers = int(model.config.num_hidden_layers)
    ids = prompt_ids(tokenizer, args.tokens)
    engines = {"unpruned": LazyLLM(model, Schedule.keep_all(args.model, layers))}
    engines.update({k: LazyLLM(model, s) for k, s in schedules(args.model, layers).items()})
    engines["unpruned"].generate(ids, max_new_tokens=2, eos_token_id=[])  # warm-up
    results: dict[str, list[GenerationResult]] = {k: [] for k in engines}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(engines)
        rng.shuffle(order)
        for k in order:
            results[k].append(engines[k].generate(ids, max_new_tokens=args.new_tokens, eos_token_id=[]))
    base = results["unpruned"]
    print(
        f"model {args.model}, prompt {ids.shape[1]} tokens, {args.new_tokens} new tokens, {args.rounds} paired rounds"
    )
    print(
        f"{'schedule':<24}{'TTFT x':>8}{'total x':>9}{'decode ms/tok':>15}{'prompt computed':>17}{'Aux peak':>12}"
    )
    rows = []
    for k, rs in results.items():
        decode = statistics.median((r.total_s - r.ttft_s) / (len(r.token_ids) - 1) for r in rs) * 1000
        row = {
            "schedule": k,
            "ttft_speedup": paired_ratio([b.ttft_s for b in base], [r.ttft_s for r in rs]),
            "total_speedup": paired_ratio([b.total_s for b in base], [r.total_s for r in rs]),
            "decode_ms_per_token": decode,
            "prompt_computed_pct": 100 * rs[-1].prompt_computed_fraction,
            "aux_peak_mib": rs[-1].aux_peak_bytes / 2**20,
            "same_tokens_as_unpruned": rs[-1].token_ids == base[-1].token_ids,
        }
        rows.append(row)
        print(f"{k:<24}{row['ttft_speedup']:>7.2f}x{row['total_speedup']:>8.2f}x{decode:>15.1f}"
              f"{row['prompt_computed_pct']:>16.1f}%{row['aux_peak_mib']:>9.1f} MiB")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
