"""Whole-generation speed of LazyLLM against transformers' own cached decoding: paired, interleaved timing.

    python benchmarks/generation_speed.py [--model smollm2-135m] [--tokens 2048] [--new-tokens 64 256]
        [--rounds 3] [--policies dynamic frozen budget:32] [--json out.json]

A real LongBench context (multi_news) cut to ``--tokens`` tokens; exactly ``--new-tokens`` greedy
tokens (EOS ignored). The baseline ("unpruned") is ``model.generate`` with its KV cache; its TTFT is
read by a streamer when the first new token arrives. Each round runs the baseline, the keep-all
engine and every schedule under every revival policy once, in shuffled order; every ratio is taken
within a round and summarised by its median (and min-max over rounds).

Reported per method: TTFT speedup and total speedup over the baseline, decode ms/token
((total - TTFT) / (new tokens - 1), median), share of prompt (token, layer) pairs computed over the
whole generation, revived (token, layer) pairs per decoding step, and whether the tokens equal the
baseline's.

``--decoding`` measures instead what the decoding strategy costs, through the product's own calls:
for keep-all and one pruning schedule with ``frozen`` revival, ``generate`` greedy, ``generate``
sampling (temperature 0.7, top-k 50, top-p 0.9, a seed) and ``stream`` (greedy, every piece taken),
in shuffled order within each round. Reported per row: TTFT (s) and decode ms/token (medians), and
their ratios to greedy on the same schedule, paired within a round (1.00: costs nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

from lazyllm import LazyLLM, Schedule, load_model
from lazyllm.timing import synchronize

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


@dataclass(frozen=True)
class Run:
    """One timed generation."""

    ttft_s: float
    total_s: float
    tokens: list[int]
    prompt_computed: float = 1.0
    revived_per_step: float = 0.0


class _FirstToken(BaseStreamer):
    """Records when transformers' generate emits its first new token (the first put is the prompt)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def transformers_run(model: Any, ids: torch.Tensor, new_tokens: int) -> Run:
    streamer = _FirstToken()
    synchronize(ids.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            streamer=streamer,
        )
    synchronize(ids.device)
    total = time.perf_counter() - t0
    assert streamer.first is not None
    return Run(streamer.first - t0, total, out[0, ids.shape[1] :].tolist())


def engine_run(engine: LazyLLM, ids: torch.Tensor, new_tokens: int) -> Run:
    r = engine.generate(ids, max_new_tokens=new_tokens, eos_token_id=[])
    return Run(
        r.ttft_s, r.total_s, r.token_ids, r.prompt_computed_fraction, r.revived_pairs / max(1, new_tokens - 1)
    )


SAMPLED: dict[str, Any] = dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.9, seed=0)
DECODINGS = ("greedy", "sampling", "streaming")


def decoding_run(engine: LazyLLM, ids: torch.Tensor, new_tokens: int, how: str) -> Run:
    """One generation of exactly ``new_tokens`` tokens, greedy, sampled or streamed (greedy)."""
    if how == "streaming":
        stream = engine.stream(ids, max_new_tokens=new_tokens, eos_token_id=[])
        for _ in stream:
            pass
        r = stream.result
    else:
        options = SAMPLED if how == "sampling" else {}
        r = engine.generate(ids, max_new_tokens=new_tokens, eos_token_id=[], **options)
    return Run(r.ttft_s, r.total_s, r.token_ids, r.prompt_computed_fraction)


def decoding_table(
    args: argparse.Namespace, model: Any, tokenizer: Any, ids: torch.Tensor
) -> list[dict[str, Any]]:
    """Greedy vs sampling vs streaming, side by side (see the module docstring)."""
    layers = int(model.config.num_hidden_layers)
    pruned = schedules(args.model, layers)["progressive-30%"].with_revival("frozen")
    engines = {
        "keep-all": LazyLLM(model, Schedule.keep_all(args.model, layers), tokenizer=tokenizer),
        "progressive-30% frozen": LazyLLM(model, pruned, tokenizer=tokenizer),
    }
    rng = random.Random(args.seed)
    rows = []
    for new_tokens in args.new_tokens:
        decoding_run(engines["keep-all"], ids, 2, "greedy")  # warm-up
        runs = [(e, how) for e in engines for how in DECODINGS]
        results: dict[tuple[str, str], list[Run]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            order = list(runs)
            rng.shuffle(order)
            for name, how in order:
                results[(name, how)].append(decoding_run(engines[name], ids, new_tokens, how))
        print(
            f"\nmodel {args.model}, prompt {ids.shape[1]} tokens, {new_tokens} new tokens, {args.rounds} "
            f"paired rounds, threads {torch.get_num_threads()}; median [min-max] over rounds; "
            "ratio = this / greedy on the same schedule (1.00: costs nothing)"
        )
        print(f"| {'schedule':<24} | {'decoding':<9} | TTFT s | decode ms/tok | {'TTFT / greedy':<17} "
              f"| {'decode / greedy':<17} | prompt pairs % |")  # fmt: skip
        print(f"|{'-' * 26}|{'-' * 11}|--------|---------------|{'-' * 19}|{'-' * 19}|----------------|")
        for (name, how), rs in results.items():
            greedy = results[(name, "greedy")]
            per_tok = [(r.total_s - r.ttft_s) / (new_tokens - 1) for r in rs]
            greedy_tok = [(g.total_s - g.ttft_s) / (new_tokens - 1) for g in greedy]
            ttft_ratio = [r.ttft_s / g.ttft_s for r, g in zip(rs, greedy)]
            decode_ratio = [a / b for a, b in zip(per_tok, greedy_tok)]
            row = {
                "schedule": name,
                "decoding": how,
                "new_tokens": new_tokens,
                "rounds": args.rounds,
                "ttft_s": statistics.median(r.ttft_s for r in rs),
                "decode_ms_per_token": 1000 * statistics.median(per_tok),
                "ttft_ratio_to_greedy": statistics.median(ttft_ratio),
                "ttft_ratio_range": [min(ttft_ratio), max(ttft_ratio)],
                "decode_ratio_to_greedy": statistics.median(decode_ratio),
                "decode_ratio_range": [min(decode_ratio), max(decode_ratio)],
                "prompt_computed_pct": 100 * rs[-1].prompt_computed,
            }
            rows.append(row)
            print(f"| {name:<24} | {how:<9} | {row['ttft_s']:>6.3f} | {row['decode_ms_per_token']:>13.1f} "
                  f"| {spread(ttft_ratio):<17} | {spread(decode_ratio):<17} "
                  f"| {row['prompt_computed_pct']:>14.1f} |", flush=True)  # fmt: skip
    return rows


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", nargs="+", default=["dynamic", "frozen", "budget:32"])
    parser.add_argument("--only", nargs="*", help="methods to run besides the baseline (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--decoding", action="store_true", help="greedy vs sampling vs streaming instead of vs transformers"
    )
    args = parser.parse_args(argv)

    model, tokenizer = load_model(args.model)
    layers = int(model.config.num_hidden_layers)
    ids = prompt_ids(tokenizer, args.tokens).to(next(model.parameters()).device)
    if args.decoding:
        rows = decoding_table(args, model, tokenizer, ids)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=2))
        return 0
    engines = {"keep-all engine": LazyLLM(model, Schedule.keep_all(args.model, layers))}
    for name, schedule in schedules(args.model, layers).items():
        for policy in args.policies:
            engines[f"{name} {policy}"] = LazyLLM(model, schedule.with_revival(policy))
    if args.only:
        engines = {k: e for k, e in engines.items() if k in args.only}
    rng = random.Random(args.seed)
    rows = []
    for new_tokens in args.new_tokens:
        runs: dict[str, Callable[[], Run]] = {
            "unpruned": lambda n=new_tokens: transformers_run(model, ids, n)
        }
        runs |= {k: (lambda e=e, n=new_tokens: engine_run(e, ids, n)) for k, e in engines.items()}
        transformers_run(model, ids, 2)  # warm-up
        engines_list = list(engines.values())
        if engines_list:
            engine_run(engines_list[0], ids, 2)
        results: dict[str, list[Run]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            order = list(runs)
            rng.shuffle(order)
            for k in order:
                results[k].append(runs[k]())
        base = results["unpruned"]
        print(
            f"\nmodel {args.model}, prompt {ids.shape[1]} tokens, {new_tokens} new tokens, "
            f"{args.rounds} paired rounds, threads {torch.get_num_threads()}; median [min-max] over rounds"
        )
        print(
            f"| {'method':<32} | {'TTFT x':<17} | {'total x':<17} | decode ms/tok | prompt pairs % "
            "| revived/step | same tokens |"
        )
        print(
            f"|{'-' * 34}|{'-' * 19}|{'-' * 19}|---------------|----------------|--------------|-------------|"
        )
        for k, rs in results.items():
            ttft = [b.ttft_s / r.ttft_s for b, r in zip(base, rs)]
            total = [b.total_s / r.total_s for b, r in zip(base, rs)]
            decode = statistics.median((r.total_s - r.ttft_s) / (new_tokens - 1) for r in rs) * 1000
            row = {
                "method": k,
                "new_tokens": new_tokens,
                "rounds": args.rounds,
                "ttft_speedup": statistics.median(ttft),
                "ttft_speedup_range": [min(ttft), max(ttft)],
                "total_speedup": statistics.median(total),
                "total_speedup_range": [min(total), max(total)],
                "decode_ms_per_token": decode,
                "prompt_computed_pct": 100 * rs[-1].prompt_computed,
                "revived_pairs_per_step": rs[-1].revived_per_step,
                "same_tokens_as_unpruned": rs[-1].tokens == base[-1].tokens,
            }
            rows.append(row)
            print(f"| {k:<32} | {spread(ttft):<17} | {spread(total):<17} | {decode:>13.1f} "
                  f"| {row['prompt_computed_pct']:>14.1f} | {row['revived_pairs_per_step']:>12.1f} "
                  f"| {'yes' if row['same_tokens_as_unpruned'] else 'no':>11} |", flush=True)  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
