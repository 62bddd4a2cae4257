"""Prefill speed of the LazyLLM engine against transformers: paired, interleaved timing.

    python benchmarks/prefill_speed.py [--model smollm2-135m] [--lengths 1024 2048 4096] [--rounds 5]

Per prompt length, each round runs every method once in a shuffled order (so no method always runs
first after a warm or cold cache). Two statistics per ratio: the ratio of each side's fastest run
(``min``, the tuner's statistic: background load only adds time) and the median of the per-round
ratios (``median``). On a quiet machine they agree; when they do not, the machine was busy.

Reported per length: keep-all overhead (engine with nothing pruned / transformers forward, target
<= 1.03) and, per schedule, realized speedup (transformers / engine) over the FLOP-model speedup
(target >= 0.9). The transformers forward uses ``logits_to_keep=1`` like a generate prefill does.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from lazyllm import LazyLLM, ModelDims, Schedule, flop_speedup, load_model
from lazyllm.timing import paired_ratio, timed
from tuner.evaluation.speed import min_ratio


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    model, _ = load_model(args.model)
    layers = model.config.num_hidden_layers
    dims = ModelDims.from_config(model.config)
    scheds = schedules(args.model, layers)
    engines = {"keep-all": LazyLLM(model, Schedule.keep_all(args.model, layers))}
    engines.update({k: LazyLLM(model, s) for k, s in scheds.items()})
    rng = random.Random(args.seed)
    print(
        f"model {args.model}, device {engines['keep-all'].device}, threads {torch.get_num_threads()}, "
        f"{args.rounds} paired rounds per length"
    )
    rows = []
    for n in args.lengths:
        ids = torch.randint(
            100, model.config.vocab_size - 100, (1, n), generator=torch.Generator().manual_seed(n)
        )
        ids = ids.to(engines["keep-all"].device)

        def hf(ids: torch.Tensor = ids) -> None:
            with torch.inference_mode():
                model(ids, logits_to_keep=1)

        runs = {"transformers": hf} | {k: (lambda e=e, ids=ids: e.prefill(ids)) for k, e in engines.items()}
        for fn in runs.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.rounds):
            order = list(runs)
            rng.shuffle(order)
            for k in order:
                times[k].append(timed(runs[k])[1])
        base = times["transformers"]
        row: dict[str, object] = {
            "tokens": n,
            "rounds": args.rounds,
            "transformers_s": min(base),
            "keep_all_overhead": 1 / min_ratio(base, times["keep-all"]),
            "keep_all_overhead_median": 1 / paired_ratio(base, times["keep-all"]),
        }
        print(
            f"\n{n} tokens: transformers {min(base):.3f} s (fastest of {args.rounds}), keep-all overhead "
            f"{row['keep_all_overhead']:.3f}x (min) / {row['keep_all_overhead_median']:.3f}x (median)"
        )
        print(
            f"  {'schedule':<24}{'computed %':>11}{'FLOP model':>12}{'realized':>10}{'ratio':>7}"
            f"{'realized(med)':>15}{'ratio':>7}"
        )
        for k, s in scheds.items():
            realized, realized_med = min_ratio(base, times[k]), paired_ratio(base, times[k])
            model_speedup = flop_speedup(s, dims, n)
            computed = 100 * sum(s.keep_counts(n)) / (n * layers)
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
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
