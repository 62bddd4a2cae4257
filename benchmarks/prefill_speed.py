"""Prefill speed of the LazyLLM engine against transformers: paired, interleaved timing.

    python benchmarks/prefill_speed.py [--model smollm2-135m] [--lengths 1024 2048 4096] [--rounds 5]
        [--dtypes float32 bfloat16]

Per prompt length, each round runs every method once in a shuffled order (so no method always runs
first after a warm or cold cache). Two statistics per ratio: the ratio of each side's fastest run
(``min``, the tuner's statistic: background load only adds time) and the median of the per-round
ratios (``median``). On a quiet machine they agree; when they do not, the machine was busy.

Reported per length: keep-all overhead (engine with nothing pruned / transformers forward, target
<= 1.03) and, per schedule, realized speedup (transformers / engine) over the FLOP-model speedup
(target >= 0.9). The transformers forward uses ``logits_to_keep=1`` like a generate prefill does.
With ``--dtypes A B`` both dtypes' models run in the same shuffled rounds, and each side's speed in
``B`` over ``A`` is reported too (how much a dtype alone buys).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from lazyllm import LazyLLM, ModelDims, Schedule, flop_speedup, load_model
from lazyllm.models import DTYPES
from lazyllm.timing import paired_ratio, timed
from tuner.statistics.speed import min_ratio


def schedules(name: str, layers: int) -> dict[str, Schedule]:
    """Three paper-style schedules of increasing strength, defined relative to the model's depth."""
    half, third = layers // 2, layers // 3
    return {
        "late-50%": Schedule.from_layers(name, layers, {half: 50}),
        "progressive-30%": Schedule.paper_style(name, layers),
        "early-progressive-10%": Schedule.progressive(
            name, layers, start_layer=third, final_keep=0.1, stages=5
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtypes", nargs="+", default=["auto"], choices=tuple(DTYPES),
        help="one row set per dtype, timed in the same rounds; with two, also the second over the first",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    sides: dict[str, dict[str, Callable[[torch.Tensor], object]]] = {}
    scheds: dict[str, Schedule] = {}
    dims = None
    layers = 0
    for dtype in args.dtypes:
        model, _ = load_model(args.model, dtype=dtype)
        layers = model.config.num_hidden_layers
        dims = ModelDims.from_config(model.config)
        scheds = schedules(args.model, layers)
        engines = {"keep-all": LazyLLM(model, Schedule.keep_all(args.model, layers))}
        engines.update({k: LazyLLM(model, sch) for k, sch in scheds.items()})

        def hf(ids: torch.Tensor, model: Any = model) -> None:
            with torch.inference_mode():
                model(ids, logits_to_keep=1)

        sides[dtype] = {"transformers": hf} | {k: e.prefill for k, e in engines.items()}
    assert dims is not None
    device = next(model.parameters()).device  # every dtype's model loads onto the same device
    rng = random.Random(args.seed)
    print(
        f"model {args.model}, device {device}, dtypes {', '.join(args.dtypes)}, threads "
        f"{torch.get_num_threads()}, {args.rounds} paired rounds per length"
    )
    rows = []
    for n in args.lengths:
        ids = torch.randint(100, dims.vocab - 100, (1, n), generator=torch.Generator().manual_seed(n)).to(
            device
        )
        runs = {(d, k): fn for d, side in sides.items() for k, fn in side.items()}
        for fn in runs.values():  # warm-up
            fn(ids)
        times: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            order = list(runs)
            rng.shuffle(order)
            for key in order:
                times[key].append(timed(functools.partial(runs[key], ids), device)[1])
        for dtype in args.dtypes:
            base = times[(dtype, "transformers")]
            row: dict[str, object] = {
                "tokens": n,
                "dtype": dtype,
                "rounds": args.rounds,
                "transformers_s": min(base),
                "keep_all_overhead": 1 / min_ratio(base, times[(dtype, "keep-all")]),
                "keep_all_overhead_median": 1 / paired_ratio(base, times[(dtype, "keep-all")]),
            }
            print(
                f"\n{n} tokens, {dtype}: transformers {min(base):.3f} s (fastest of {args.rounds}), keep-all "
                f"overhead {row['keep_all_overhead']:.3f}x (min) / {row['keep_all_overhead_median']:.3f}x (median)"
            )
            print(
                f"  {'schedule':<24}{'computed %':>11}{'FLOP model':>12}{'realized':>10}{'ratio':>7}"
                f"{'realized(med)':>15}{'ratio':>7}"
            )
            for k, sch in scheds.items():
                realized, realized_med = (
                    min_ratio(base, times[(dtype, k)]),
                    paired_ratio(base, times[(dtype, k)]),
                )
                model_speedup = flop_speedup(sch, dims, n)
                computed = 100 * sum(sch.keep_counts(n)) / (n * layers)
                row[k] = {
                    "realized": realized,
                    "realized_median": realized_med,
                    "flop_model": model_speedup,
                    "computed_pct": computed,
                }
                print(
                    f"  {k:<24}{computed:>10.1f}%{model_speedup:>11.2f}x{realized:>9.2f}x"
                    f"{realized / model_speedup:>7.2f}{realized_med:>14.2f}x{realized_med / model_speedup:>7.2f}"
                )
            rows.append(row)
        if len(args.dtypes) == 2:  # the second dtype's speed over the first's, same rounds
            a, b = args.dtypes
            cross = {
                k: {
                    "min": min_ratio(times[(a, k)], times[(b, k)]),
                    "median": paired_ratio(times[(a, k)], times[(b, k)]),
                }
                for k in sides[a]
            }
            rows.append({"tokens": n, "speedup_of": b, "over": a, "rounds": args.rounds, **cross})
            print(
                f"  {b} over {a}: "
                + ", ".join(f"{k} {v['min']:.2f}x ({v['median']:.2f}x median)" for k, v in cross.items())
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
