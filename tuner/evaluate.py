"""Compare methods on a LongBench task split: the LazyLLM paper's Table 1 and Table 2 on our models.

    python -m tuner.evaluate --task qa --split test --schedule s.json [--preset qa] \\
        [--methods baseline,random,static,compression,lazyllm] [--data-dir DIR] [--output DIR]

Table 1: score per category (macro average of its datasets' LongBench scores) and measured TTFT
speedup, per method. Table 2: share of prompt (token, layer) pairs computed and measured generation
(total time) speedup. Both with sample counts. Table 3: each method's accuracy loss with its paired
bootstrap interval (:func:`tuner.evaluation.runner.loss_estimate`, the one bootstrap of :mod:`tuner.statistics.bootstrap`).

Speedups are measured as the search measures them (:mod:`tuner.evaluation.speed`, see
:meth:`tuner.evaluation.runner.Evaluator.measure_speed`): per category, on its example of median prompt
length, ``--timing-rounds`` interleaved rounds, minimum per side, on ``--timing-clock`` (``auto``: the
CPU thread clock on a CPU); the report names the clock and the rounds.

Written as markdown, CSV and PNG under ``--output``, with per-example JSONL and a summary JSON per method (reruns overwrite). The default ``--output`` is
``outputs/evaluate/<model>-<task>-<split>``, so evaluations of different tasks never overwrite each other.

Method knobs: ``--method-options gemfilter.k=0.3,tsp.layer=14`` (validated before the model loads).
``--match-speedup`` adds the peers at the schedule's speedup and loss (:mod:`tuner.evaluation.matched`):
``matched.md``, ``matched.csv``, ``matched.png``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from lazyllm.cli import cli_main
from lazyllm.flops import ModelDims
from lazyllm.methods import Generator, make_method, peer_names
from lazyllm.methods import method as method_spec
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from tuner.data.longbench import dataset_spec
from tuner.data.metrics import task_score
from tuner.evaluation import matched
from tuner.evaluation.runner import Evaluator, Example, ExampleResult, MethodSpeed, summarize, write_results
from tuner.redact import redact_text
from tuner.study.preflight import check_evaluate
from tuner.study.settings import EvaluateSettings, add_flags, settings_from_flags

COMPUTE_MATCHED = frozenset({"random", "static", "compression"})
"""Baselines built to compute what the schedule computes (:mod:`lazyllm.methods`): the FLOP model
their measured speedup is checked against is the schedule's."""


Item = TypeVar("Item", Example, ExampleResult)


def by_category(items: Sequence[Item]) -> dict[str, list[Item]]:
    """Examples (or results) per LongBench category of their dataset, then ``"all"``."""
    groups: dict[str, list[Item]] = {}
    for item in items:
        groups.setdefault(dataset_spec(item.dataset).category, []).append(item)
    groups["all"] = list(items)
    return groups


def time_method(
    settings: EvaluateSettings,
    evaluator: Evaluator,
    method: str,
    generator: Generator,
    schedule: Schedule | None,
) -> dict[str, MethodSpeed]:
    """Category (and ``"all"``) -> the method's measured speedups on that category's timing example
    (:meth:`Evaluator.timing_example`); an example shared by several categories is timed once."""
    dims = ModelDims.from_config(evaluator.model.config)
    options = settings.options_by_method.get(method, {})
    reference = "lazyllm" if method in COMPUTE_MATCHED else method
    timed: dict[str, MethodSpeed] = {}
    out: dict[str, MethodSpeed] = {}
    for category, examples in by_category(evaluator.examples).items():
        ex = evaluator.timing_example(examples)
        if ex.key not in timed:
            flops = matched.median_flop_speedup(reference, options, schedule, dims, [len(ex.input_ids)])
            timed[ex.key] = evaluator.measure_speed(
                generator, ex, flops, rounds=settings.timing_rounds, clock=settings.timing_clock
            )
        out[category] = timed[ex.key]
    return out


def category_table(
    results: dict[str, list[ExampleResult]], speeds: dict[str, dict[str, MethodSpeed]]
) -> list[dict[str, Any]]:
    """One row per (method, category) plus an "all" row: score, measured speedups (1 for the baseline,
    by definition), computed %, counts, and the timing's example, clock and rounds."""
    rows: list[dict[str, Any]] = []
    for method, res in results.items():
        for category, items in by_category(res).items():
            by_ds: dict[str, list[float]] = {}
            for r in items:
                by_ds.setdefault(r.dataset, []).append(r.score)
            speed = speeds.get(method, {}).get(category)
            rows.append(
                {
                    "method": method,
                    "category": category,
                    "datasets": len(by_ds),
                    "examples": len(items),
                    "score": round(statistics.fmean(task_score(v) for v in by_ds.values()), 2),
                    "ttft_speedup": round(speed.ttft.speedup, 3) if speed else 1.0,
                    "total_speedup": round(speed.total.speedup, 3) if speed else 1.0,
                    "prompt_computed_pct": round(
                        100 * statistics.fmean(r.prompt_computed_fraction for r in items), 1
                    ),
                    "timing_example": speed.example if speed else "",
                    "timing_clock": speed.clock if speed else "",
                    "timing_rounds": speed.ttft.rounds if speed else 0,
                }
            )
    return rows


def timing_note(rows: list[dict[str, Any]]) -> str:
    """How the speedups were measured, from the rows: clock(s) and rounds."""
    timed = [r for r in rows if r["timing_clock"]]
    if not timed:
        return "no method was timed (the baseline's speedup is 1 by definition)"
    clocks = ", ".join(sorted({r["timing_clock"] for r in timed}))
    rounds = sorted({int(r["timing_rounds"]) for r in timed})
    span = str(rounds[0]) if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}"
    return (
        f"speedups measured by tuner.evaluation.speed: clock {clocks}, {span} interleaved rounds per side (minimum "
        "per side), on each category's example of median prompt length; the baseline is 1 by definition"
    )


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

    lines = [header, "", timing_note(rows), "", "**Table 1**: score / measured TTFT speedup", ""]
    lines += table(lambda r: f"{r['score']:.2f} / {r['ttft_speedup']:.2f}x")
    lines += ["", "**Table 2**: prompt (token, layer) pairs computed / measured generation speedup", ""]
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
    clocks = ", ".join(sorted({r["timing_clock"] for r in rows if r["timing_clock"]})) or "-"
    ax.set_xlabel(f"measured TTFT speedup (x, tuner.evaluation.speed, clock {clocks})")
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
    return settings_from_flags(args, EvaluateSettings)


def evaluate(settings: EvaluateSettings) -> int:
    """Evaluate every method of ``settings`` and write the report; returns 0."""
    schedule = check_evaluate(settings)  # schedule file and data: before the model loads, before any write
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
    speeds: dict[str, dict[str, MethodSpeed]] = {}
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
            speeds[method] = time_method(settings, evaluator, method, generator, schedule)
        results[method] = res
        summaries[method] = summarize(res, baseline, speeds.get(method, {}).get("all"))
        write_results(res, summaries[method], out, method)
    rows = category_table(results, speeds)
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
        known = (
            {"lazyllm": matched.Evaluated(results["lazyllm"], speeds["lazyllm"]["all"])}
            if "lazyllm" in results and not options.get("lazyllm")
            else {}
        )
        text += "\n" + matched.run(settings, evaluator, schedule, baseline, known)
    print(text)
    print(f"written: {out}/report.md, report.csv, report.png, <method>.jsonl, <method>.summary.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli_main(_parser(), lambda args: evaluate(settings_from_args(args)), argv, redact=redact_text)


if __name__ == "__main__":
    sys.exit(main())
