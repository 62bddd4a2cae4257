"""Compare methods on a LongBench task split: the LazyLLM paper's Table 1 and Table 2 on our models.

    python -m tuner.evaluate --task qa --split test --schedule s.json \\
        [--methods baseline,random,static,compression,lazyllm] [--data-dir DIR] [--output DIR]

Table 1: score per category (macro average of its datasets' LongBench scores) and median paired TTFT
speedup, per method. Table 2: share of prompt (token, layer) pairs computed and median generation
(total time) speedup. Both with sample counts. Written as markdown, CSV and PNG under ``--output``,
with per-example JSONL and a summary JSON per method (reruns overwrite).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lazyllm.methods import check_method, make_method, method_names
from lazyllm.models import DEFAULT_MODEL, ModelLoadError, load_model
from lazyllm.schedule import Schedule
from tuner.evaluation import (
    EvalConfig,
    Evaluator,
    ExampleResult,
    summarize,
    write_results,
)
from tuner.longbench import DATASETS
from tuner.metrics import task_score


def category_table(results: dict[str, list[ExampleResult]]) -> list[dict[str, Any]]:
    """One row per (method, category) plus an "all" row: score, speedups, computed %, counts."""
    rows: list[dict[str, Any]] = []
    for method, res in results.items():
        groups: dict[str, list[ExampleResult]] = {}
        for r in res:
            groups.setdefault(DATASETS[r.dataset].category, []).append(r)
        groups["all"] = list(res)
        for category, items in groups.items():
            by_ds: dict[str, list[float]] = {}
            for r in items:
                by_ds.setdefault(r.dataset, []).append(r.score)
            rows.append(
                {
                    "method": method,
                    "category": category,
                    "datasets": len(by_ds),
                    "examples": len(items),
                    "score": round(statistics.fmean(task_score(v) for v in by_ds.values()), 2),
                    "ttft_speedup": round(statistics.median(r.ttft_speedup for r in items), 3),
                    "total_speedup": round(statistics.median(r.total_speedup for r in items), 3),
                    "prompt_computed_pct": round(
                        100 * statistics.fmean(r.prompt_computed_fraction for r in items), 1
                    ),
                }
            )
    return rows


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    categories = list(dict.fromkeys(r["category"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["category"]): r for r in rows}
    counts = {c: next(r for r in rows if r["category"] == c) for c in categories}
    head = "| method | " + " | ".join(f"{c} (n={counts[c]['examples']})" for c in categories) + " |"
    sep = "|---" * (len(categories) + 1) + "|"

    def table(fmt: Any) -> list[str]:
        return [head, sep] + [
            f"| {m} | " + " | ".join(fmt(cell[(m, c)]) if (m, c) in cell else "-" for c in categories) + " |"
            for m in methods
        ]

    lines = [header, "", "**Table 1**: score / median paired TTFT speedup", ""]
    lines += table(lambda r: f"{r['score']:.2f} / {r['ttft_speedup']:.2f}x")
    lines += ["", "**Table 2**: prompt (token, layer) pairs computed / median generation speedup", ""]
    lines += table(lambda r: f"{r['prompt_computed_pct']:.1f}% / {r['total_speedup']:.2f}x")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["category"] != "all":
            continue
        ax.scatter(r["ttft_speedup"], r["score"], s=60)
        ax.annotate(r["method"], (r["ttft_speedup"], r["score"]), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("median paired TTFT speedup (x)")
    ax.set_ylabel("score (macro over datasets)")
    ax.set_title("methods on all datasets of the task")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tuner.evaluate", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument(
        "--task", default="qa", help="category, qa, dataset name or comma list (default: %(default)s)"
    )
    p.add_argument("--language", default="en", choices=["en", "zh", "all"])
    p.add_argument("--split", default="test", choices=["validation", "test"])
    p.add_argument(
        "--schedule", type=Path, help="LazyLLM schedule JSON (needed by every method but baseline)"
    )
    p.add_argument(
        "--methods",
        default="baseline,random,static,compression,lazyllm",
        help=f"comma list of: {', '.join(method_names())} (default: %(default)s)",
    )
    p.add_argument("--n-examples", type=int, help="at most this many examples per dataset")
    p.add_argument("--max-prompt-tokens", type=int, default=EvalConfig.max_prompt_tokens)
    p.add_argument("--max-new-tokens", type=int, help="cap on LongBench's generation lengths")
    p.add_argument("--data-dir", help="LongBench folder (default: $LONGBENCH_DIR)")
    p.add_argument("--output", type=Path, default=Path("outputs/evaluate"), help="default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help="random drop seed")
    p.add_argument("--allow-other-model", action="store_true", help="use a schedule made for another model")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        for method in methods:
            check_method(method)
        config = EvalConfig(
            model=args.model,
            task=args.task,
            language=args.language,
            split=args.split,
            n_examples=args.n_examples,
            max_prompt_tokens=args.max_prompt_tokens,
            max_new_tokens=args.max_new_tokens,
            data_dir=args.data_dir,
        )
        schedule = Schedule.load(args.schedule) if args.schedule else None
        if schedule is None and any(m != "baseline" for m in methods):
            raise ValueError("--schedule is needed for methods other than baseline")
        args.output.mkdir(parents=True, exist_ok=True)
        model, tokenizer = load_model(args.model)
        if schedule is not None:
            schedule.check_model(
                args.model, int(model.config.num_hidden_layers), strict_name=not args.allow_other_model
            )
        evaluator = Evaluator(model, tokenizer, config, args.output / "cache")
    except (ValueError, ModelLoadError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    baseline = evaluator.baseline_results()
    results: dict[str, list[ExampleResult]] = {}
    for method in methods:
        if method == "baseline":
            res = baseline
        else:
            res, _ = evaluator.evaluate(
                method, make_method(method, model, tokenizer, schedule, seed=args.seed)
            )
        results[method] = res
        write_results(res, summarize(res, baseline), args.output, method)
    rows = category_table(results)
    header = (
        f"model {args.model}, task {args.task} ({args.language}), split {args.split}, "
        f"{len(evaluator.examples)} examples, prompts cut to {args.max_prompt_tokens} tokens"
        + (f", schedule {args.schedule}" if args.schedule else "")
    )
    text = markdown(rows, header)
    (args.output / "report.md").write_text(text)
    with (args.output / "report.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.output / "report.png")
    print(text)
    print(f"written: {args.output}/report.md, report.csv, report.png, <method>.jsonl, <method>.summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
