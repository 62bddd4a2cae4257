"""Compare methods on a LongBench task split: the LazyLLM paper's Table 1 and Table 2 on our models.

    python -m tuner.evaluate --task qa --split test --schedule s.json [--preset qa] \\
        [--methods baseline,random,static,compression,lazyllm] [--data-dir DIR] [--output DIR]

Table 1: score per category (macro average of its datasets' LongBench scores) and median paired TTFT
speedup, per method. Table 2: share of prompt (token, layer) pairs computed and median generation
(total time) speedup. Both with sample counts. Written as markdown, CSV and PNG under ``--output``,
with per-example JSONL and a summary JSON per method (reruns overwrite). The default ``--output`` is
``outputs/evaluate/<model>-<task>-<split>``, so evaluations of different tasks never overwrite each other.

Method knobs: ``--method-options gemfilter.k=0.3,tsp.layer=14`` (validated before the model loads).
``--match-speedup`` adds the peers at the schedule's speedup and loss (:mod:`tuner.matched`):
``matched.md``, ``matched.csv``, ``matched.png``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lazyllm.cli import cli_main
from lazyllm.methods import make_method, peer_names
from lazyllm.methods import method as method_spec
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from tuner import matched
from tuner.datasource import resolve_source
from tuner.evaluation import Evaluator, ExampleResult, summarize, write_results
from tuner.longbench import DATASETS
from tuner.metrics import task_score
from tuner.settings import EvaluateSettings, add_flags, resolve_settings


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


def loss_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Table 3: each method's accuracy loss against the baseline with its interval and sample count."""
    rows = {m: s for m, s in summaries.items() if m != "baseline"}
    if not rows:
        return ""
    level = round(100 * next(iter(rows.values()))["interval_level"])
    lines = [
        "",
        f"**Table 3**: accuracy loss against the baseline on the same examples (score points, macro over "
        f"datasets; {level}% paired bootstrap interval over examples, one-sided {level}% upper bound)",
        "",
        "| method | n | loss | interval | upper bound |",
        "|---|---|---|---|---|",
    ]
    for method, summ in rows.items():
        low, high = summ["accuracy_loss_interval"]
        lines.append(
            f"| {method} | {summ['n_examples']} | {summ['accuracy_loss']:.2f} | [{low:.2f}, {high:.2f}] "
            f"| {summ['accuracy_loss_upper']:.2f} |"
        )
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
    p.add_argument("--preset", help="YAML preset: a name under studies/ (e.g. qa) or a path")
    add_flags(p, EvaluateSettings)
    return p


def settings_from_args(args: argparse.Namespace) -> EvaluateSettings:
    values = dict(vars(args))
    preset = values.pop("preset")
    values.pop("debug", None)
    return resolve_settings(preset, values, EvaluateSettings)


def evaluate(settings: EvaluateSettings) -> int:
    """Evaluate every method of ``settings`` and write the report; returns 0."""
    schedule = Schedule.load(settings.schedule) if settings.schedule else None
    resolve_source(settings.data_dir).load_task(settings.task, settings.language)  # before the model loads
    out = settings.out_dir
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(settings.model, trust_remote_code=settings.trust_remote_code)
    if schedule is not None:
        schedule.check_model(
            settings.model, int(model.config.num_hidden_layers), strict_name=not settings.allow_other_model
        )
    evaluator = Evaluator(model, tokenizer, settings.eval_only(), out / "cache")
    baseline = evaluator.baseline_results()
    results: dict[str, list[ExampleResult]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    options = settings.options_by_method
    for method in settings.method_list:
        if settings.match_speedup and method in peer_names():
            continue  # run by the matched comparison, at matched knobs and along its sweep
        if method == "baseline":
            res = baseline
        else:
            generator = make_method(
                method, model, tokenizer, schedule, seed=settings.seed, options=options.get(method)
            )
            res, _ = evaluator.evaluate(method, generator)
        results[method] = res
        summaries[method] = summarize(res, baseline)
        write_results(res, summaries[method], out, method)
    rows = category_table(results)
    header = (
        f"model {settings.model}, task {settings.task} ({settings.language}), split {settings.split}, "
        f"{len(evaluator.examples)} examples, prompts cut to {settings.max_prompt_tokens} tokens"
        + (f", schedule {settings.schedule}" if settings.schedule else "")
    )
    rules = [f"{m}: {method_spec(m).rule}" for m in settings.method_list if method_spec(m).rule]
    if schedule is not None and "lazyllm" in settings.method_list:
        rules = [r if not r.startswith("lazyllm:") else f"lazyllm: scoring {schedule.scoring}" for r in rules]
    header += "".join(f"\n- {rule}" for rule in rules)  # how each method scores tokens
    text = markdown(rows, header) + loss_table(summaries)
    (out / "report.md").write_text(text)
    with (out / "report.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / "report.png")
    if settings.match_speedup and schedule is not None:
        # the tuned schedule's results from above (same examples, schedule and seed) are reused
        known = {"lazyllm": results["lazyllm"]} if "lazyllm" in results and not options.get("lazyllm") else {}
        text += "\n" + matched.run(settings, evaluator, schedule, baseline, known)
    print(text)
    print(f"written: {out}/report.md, report.csv, report.png, <method>.jsonl, <method>.summary.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli_main(_parser(), lambda args: evaluate(settings_from_args(args)), argv)


if __name__ == "__main__":
    sys.exit(main())
