"""Where the gain goes: one schedule's TTFT and end-to-end speedup against prompt length.

    python benchmarks/length_sweep.py --schedule runs/<study>/recommended.json [--label NAME] \
        [--lengths 1024 2048 4096 8160] [--rounds 3] [--new-tokens 64] [--dtype auto] \
        [--out benchmarks/data/length-sweep-<date>/rows.jsonl] [--plot .../speedup.png]

Per prompt length (the first N tokens of LongBench's multi_news contexts, as
``benchmarks/generation_speed.py`` builds them), the engine's own timers
(:func:`tuner.statistics.speed.prefill_timer`, :func:`~tuner.statistics.speed.generation_timer`,
interleaved by :func:`~tuner.statistics.speed.measure_speedup`: minimum per side) time the unpruned
model and the schedule: **TTFT** (prefill and first token) and **end-to-end** (prefill and
``--new-tokens`` decoded tokens, EOS ignored, the schedule decoding ``frozen``). Each row also holds
the share of the prompt's (token, layer) pairs the schedule's prefill computes and the FLOP model's
speedup at that length.

Rows are appended to ``--out`` as each length finishes (one JSON object a line,
:mod:`tuner.evaluation.recorder`); a rerun with the same model, schedule, dtype, clock, rounds and
answer length skips the lengths already there, so a stopped sweep resumes; several schedules share
one rows file. ``--plot`` draws both speedups against length for every schedule in the file (of the
same model and dtype), a colour each, named by ``--label``, with the rounds behind each point.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lazyllm import LazyLLM, ModelDims, Schedule, flop_speedup, load_model
from lazyllm.models import DTYPES
from lazyllm.schedule import Revival
from tuner.evaluation.recorder import read_rows
from tuner.statistics.speed import CLOCKS, generation_timer, measure_speedup, prefill_timer, resolve_clock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generation_speed import prompt_ids  # a sibling script, not a package


def key_of(row: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two rows the same measurement (a rerun skips it)."""
    return tuple(row[k] for k in ("model", "schedule", "dtype", "clock", "rounds", "new_tokens", "tokens"))


def load_schedule(spec: str, model_name: str, layers: int) -> Schedule:
    """A schedule JSON file, or ``paper-style`` (the project's default form of the paper's recipe)."""
    if spec == "paper-style":
        return Schedule.paper_style(model_name, layers)
    return Schedule.load(spec)


def sweep_row(
    model: Any, tokenizer: Any, schedule: Schedule, tokens: int, *, rounds: int, new_tokens: int, clock: str
) -> dict[str, Any]:
    """One length's measurement (see the module docstring)."""
    layers = int(model.config.num_hidden_layers)
    ids = prompt_ids(tokenizer, tokens)
    n = int(ids.shape[-1])
    base = LazyLLM(
        model, Schedule.keep_all(schedule.model, layers), tokenizer=tokenizer, strict_model_name=False
    )
    pruned = LazyLLM(
        model, schedule.with_revival(Revival.parse("frozen")), tokenizer=tokenizer, strict_model_name=False
    )
    flops = flop_speedup(schedule, ModelDims.from_config(model.config), n)
    resolved = resolve_clock(clock, base.device)
    ttft = measure_speedup(
        prefill_timer(base, ids, resolved),
        prefill_timer(pruned, ids, resolved),
        flops,
        rounds=rounds,
        clock=resolved,
    )
    total = measure_speedup(
        generation_timer(base, ids, new_tokens, resolved),
        generation_timer(pruned, ids, new_tokens, resolved),
        flops,
        rounds=rounds,
        clock=resolved,
        plausible=(1e-6, 1e6),  # end to end includes decoding, which the FLOP model leaves out: no re-measure
    )
    computed = 100.0 * sum(schedule.keep_counts(n)) / (n * layers)
    return {
        "tokens": n,
        "flop_speedup": flops,
        "prompt_computed_pct": computed,
        "ttft_speedup": ttft.speedup,
        "ttft_baseline_s": min(ttft.baseline_s),
        "ttft_schedule_s": min(ttft.schedule_s),
        "total_speedup": total.speedup,
        "total_baseline_s": min(total.baseline_s),
        "total_schedule_s": min(total.schedule_s),
        "clock_used": resolved,
    }


def label_of(row: dict[str, Any]) -> str:
    """A schedule's name in the plot: its ``--label``, else what ``--schedule`` was given."""
    return str(row.get("label") or row["schedule"])


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """TTFT speedup (solid) and end-to-end speedup (dashed) against prompt length, a colour per
    schedule, each point labelled with its rounds; the FLOP model's TTFT in grey dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schedules: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["tokens"]):
        schedules.setdefault(label_of(r), []).append(r)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    lengths: set[int] = set()
    for i, (name, mine) in enumerate(schedules.items()):
        color = f"C{i}"
        x = [r["tokens"] for r in mine]
        lengths.update(x)
        ax.plot(x, [r["ttft_speedup"] for r in mine], "o-", color=color, label=f"{name}: TTFT")
        ax.plot(x, [r["total_speedup"] for r in mine], "s--", color=color,
                label=f"{name}: prefill + {mine[0]['new_tokens']} tokens")  # fmt: skip
        ax.plot(x, [r["flop_speedup"] for r in mine], ":", color="grey")
        for r in mine:
            ax.annotate(f"min of {r['rounds']}", (r["tokens"], r["ttft_speedup"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.plot([], [], ":", color="grey", label="FLOP model (TTFT)")
    ticks = sorted(lengths)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("speedup over the unpruned model (x)")
    ax.axhline(1.0, color="black", linewidth=0.5)
    first = rows[0]
    ax.set_title(f"{first['model']}, {first['dtype']}, {first.get('clock_used', first['clock'])} clock: measured speedup against prompt length",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--schedule", default="paper-style", help="a schedule JSON file, or paper-style")
    parser.add_argument("--label", default=None, help="the schedule's name in the plot (default: --schedule)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8160])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto", choices=tuple(DTYPES))
    parser.add_argument("--clock", default="auto", choices=CLOCKS)
    parser.add_argument("--out", type=Path, required=True, help="JSONL rows, appended and resumed")
    parser.add_argument("--plot", type=Path, help="PNG of both speedups against length")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.new_tokens < 1 or min(args.lengths) < 2:
        parser.error("--rounds and --new-tokens must be >= 1, every length >= 2")
    model, tokenizer = load_model(args.model, dtype=args.dtype)
    layers = int(model.config.num_hidden_layers)
    schedule = load_schedule(args.schedule, args.model, layers)
    rows = read_rows(args.out)
    done = {key_of(r) for r in rows}
    for tokens in args.lengths:
        common = {
            "model": args.model, "schedule": args.schedule, "label": args.label or args.schedule,
            "percentiles": list(schedule.percentiles),
            "dtype": args.dtype, "clock": args.clock, "rounds": args.rounds, "new_tokens": args.new_tokens,
        }  # fmt: skip
        if key_of({**common, "tokens": tokens}) in done:
            print(f"{tokens} tokens: already in {args.out}")
            continue
        with torch.inference_mode():
            row = {**common, **sweep_row(model, tokenizer, schedule, tokens, rounds=args.rounds,
                                         new_tokens=args.new_tokens, clock=args.clock)}  # fmt: skip
        row["tokens"] = tokens  # the length asked for (the prompt is exactly that long: prompt_ids cuts it)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        rows.append(row)
        print(
            f"{tokens} tokens: TTFT {row['ttft_speedup']:.2f}x (FLOP model {row['flop_speedup']:.2f}x), "
            f"prefill + {args.new_tokens} tokens {row['total_speedup']:.2f}x, "
            f"{row['prompt_computed_pct']:.1f}% of the prompt computed (min of {args.rounds} rounds)"
        )
    if args.plot is not None:
        plot([r for r in rows if (r["model"], r["dtype"]) == (args.model, args.dtype)], args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
