"""Batched decoding throughput: ``lazyllm.generate_batch`` against transformers' own batched ``generate``.

    python benchmarks/batch_throughput.py [--model smollm2-135m] [--batch-sizes 1 4 8] [--prompt-tokens 512]
        [--new-tokens 32] [--rounds 3] [--device cpu] [--dtype auto] [--out benchmarks/data/...json]

GPU variant (a lent machine): ``--device cuda --dtype bfloat16``.

The same prompts for every side: LongBench multi_news contexts cut to lengths spread evenly between
half of ``--prompt-tokens`` and all of it (so a batch needs padding), ``--new-tokens`` greedy tokens
each (EOS ignored). Per batch size B, every round times, in shuffled order:

* ``transformers``: ``model.generate`` on the batch left-padded by the tokenizer, with its attention
  mask (``min_new_tokens`` = ``max_new_tokens``), transformers' KV-cached decoding;
* ``keep-all``: :func:`lazyllm.batch.generate_batch` with the schedule that prunes nothing;
* ``schedule``: ``generate_batch`` with the paper-style progressive schedule, ``frozen`` revival
  (``--schedule`` for another; one that revives tokens runs per request).

Reported per (side, B): output tokens per second (B x new tokens over the wall time of the call,
median over rounds, with min-max), the ratio to transformers within each round (median, min-max),
and whether the greedy tokens of keep-all equal transformers' row by row. Rows go to ``--out`` (one
JSON per date and device, rewritten on a rerun). Timing on a shared machine measures its load too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from lazyllm import BatchRequest, LazyLLM, Schedule, generate_batch, load_model
from lazyllm.timing import synchronize

ROOT = Path(__file__).resolve().parents[1]


def prompt_ids(tokenizer: Any, count: int, longest: int) -> list[list[int]]:
    """``count`` multi_news contexts cut to lengths spread over [longest / 2, longest]."""
    data = Path(os.environ.get("LONGBENCH_DIR", ROOT.parent / "shared/data/longbench"))
    lengths = [longest // 2 + (longest - longest // 2) * i // max(1, count - 1) for i in range(count)]
    out: list[list[int]] = []
    with (data / "multi_news.jsonl").open() as fh:
        for line in fh:
            ids = tokenizer(json.loads(line)["context"])["input_ids"]
            if len(ids) >= longest:
                out.append(ids[: lengths[len(out)]])
            if len(out) == count:
                return out
    raise ValueError(f"multi_news has fewer than {count} contexts of {longest}+ tokens")


def transformers_side(model: Any, tokenizer: Any, prompts: list[list[int]], new: int) -> list[list[int]]:
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer.pad({"input_ids": prompts}, padding=True, return_tensors="pt").to(model.device)
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    return [row.tolist() for row in out[:, batch["input_ids"].shape[1] :]]


def engine_side(engine: LazyLLM, prompts: list[list[int]], new: int) -> list[list[int]]:
    requests = [BatchRequest(engine, ids, max_new_tokens=new, eos_token_id=()) for ids in prompts]
    return [r.token_ids for r in generate_batch(requests, batch_size=len(requests))]


def timed(run: Callable[[], list[list[int]]], device: torch.device) -> tuple[float, list[list[int]]]:
    synchronize(device)
    t0 = time.perf_counter()
    tokens = run()
    synchronize(device)
    return time.perf_counter() - t0, tokens


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--schedule", type=Path, help="schedule JSON (default: paper-style, frozen revival)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, help="default: benchmarks/data/batch_throughput.<date>.<device>.json"
    )
    args = parser.parse_args(argv)

    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype)
    layers = int(model.config.num_hidden_layers)
    schedule = (
        Schedule.load(args.schedule)
        if args.schedule
        else Schedule.paper_style(args.model, layers).with_revival("frozen")
    )
    engines = {
        "keep-all": LazyLLM(model, Schedule.keep_all(args.model, layers), tokenizer=tokenizer),
        "schedule": LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False),
    }
    prompts = prompt_ids(tokenizer, max(args.batch_sizes), args.prompt_tokens)
    rng = random.Random(args.seed)
    device = torch.device(args.device)
    new = args.new_tokens
    # warm-up: one short call of each side
    transformers_side(model, tokenizer, prompts[:1], 2)
    for engine in engines.values():
        engine_side(engine, prompts[:1], 2)
    rows: list[dict[str, Any]] = []
    for size in args.batch_sizes:
        batch = prompts[:size]
        sides: dict[str, Callable[[], list[list[int]]]] = {
            "transformers": lambda b=batch: transformers_side(model, tokenizer, b, new),
            **{name: (lambda e=e, b=batch: engine_side(e, b, new)) for name, e in engines.items()},
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        tokens: dict[str, list[list[int]]] = {}
        for _ in range(args.rounds):
            order = list(sides)
            rng.shuffle(order)
            for name in order:
                seconds, tokens[name] = timed(sides[name], device)
                times[name].append(seconds)
        base = times["transformers"]
        for name, seconds in times.items():
            rates = [size * new / s for s in seconds]
            ratios = [b / s for b, s in zip(base, seconds)]
            rows.append({
                "side": name, "batch_size": size, "new_tokens": new, "prompt_tokens_max": args.prompt_tokens,
                "tokens_per_s": statistics.median(rates), "tokens_per_s_min": min(rates),
                "tokens_per_s_max": max(rates), "speed_vs_transformers": statistics.median(ratios),
                "speed_vs_transformers_min": min(ratios), "speed_vs_transformers_max": max(ratios),
                "same_tokens_as_transformers": tokens[name] == tokens["transformers"], "rounds": args.rounds,
            })  # fmt: skip
            r = rows[-1]
            print(f"B={size:2d} {name:12s} {r['tokens_per_s']:8.1f} tok/s [{r['tokens_per_s_min']:.1f}-"
                  f"{r['tokens_per_s_max']:.1f}]  x{r['speed_vs_transformers']:.2f} "
                  f"[{r['speed_vs_transformers_min']:.2f}-{r['speed_vs_transformers_max']:.2f}]  "
                  f"same tokens: {r['same_tokens_as_transformers']}", flush=True)  # fmt: skip
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    machine = f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}"
    out = args.out or ROOT / "benchmarks" / "data" / f"batch_throughput.{date}.{args.device}.json"
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    out.write_text(json.dumps({"date": date, "machine": machine, "settings": settings,
                               "schedule": json.loads(schedule.to_json()), "rows": rows}, indent=1) + "\n")  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
