"""The files of ``python -m tuner.evaluate``, written once from its typed results.

Layout under ``--output``::

    <method>.jsonl, <method>.summary.json   per-example results and the summary of each method
    report.md                               the header, Table 1 (score / measured TTFT speedup),
                                            Table 2 (computed % / measured generation speedup) and
                                            Table 3 (accuracy loss with its interval)
    report.csv                              one row per (method, category), as in Tables 1 and 2
    report.png                              score against measured TTFT speedup, one point per method

Every file is written under a temporary name and moved into place (:mod:`lazyllm.atomic`); reruns
overwrite.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lazyllm.atomic import write_atomic
from lazyllm.methods import method as method_spec
from lazyllm.schedule import Schedule
from tuner.data.metrics import task_score
from tuner.evaluation.runner import EvaluationSummary, ExampleResult, MethodSpeed, by_category
from tuner.report.figure import pyplot, write_figure
from tuner.report.table import csv_text
from tuner.study.settings import EvaluateSettings

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Results = Mapping[str, Sequence[ExampleResult]]
"""Method -> its per-example results."""
Speeds = Mapping[str, Mapping[str, MethodSpeed]]
"""Method -> category (and ``"all"``) -> its measured speedups; the baseline is never timed."""

WRITTEN = "report.md, report.csv, report.png, <method>.jsonl, <method>.summary.json"


def write_method(
    results: Sequence[ExampleResult], summary: EvaluationSummary, out_dir: Path, name: str
) -> None:
    """``<name>.jsonl`` (one line per example) and ``<name>.summary.json``; reruns overwrite."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for path, text in (
        (out_dir / f"{name}.jsonl", ExampleResult.to_jsonl(results)),
        (out_dir / f"{name}.summary.json", json.dumps(summary.to_dict(), indent=2) + "\n"),
    ):
        write_atomic(path, text)


def header(settings: EvaluateSettings, n_examples: int, schedule: Schedule | None) -> str:
    """What was evaluated, then how each method scores tokens (one line each)."""
    text = (
        f"model {settings.model}, task {settings.task} ({settings.language}), split {settings.split}, "
        f"{n_examples} examples, prompts cut to {settings.max_prompt_tokens} tokens"
        + (f", schedule {settings.schedule}" if settings.schedule else "")
    )
    if settings.budget_kind == "agreement":  # a prompts file without answers (tuner.data.prompts)
        text += (
            "; no gold answers: every score is agreement with the unpruned model's own answer, and every "
            "loss is in agreement points"
        )
    rules = [f"{m}: {method_spec(m).rule}" for m in settings.method_list if method_spec(m).rule]
    if schedule is not None and "lazyllm" in settings.method_list:
        rules = [r if not r.startswith("lazyllm:") else f"lazyllm: scoring {schedule.scoring}" for r in rules]
    return text + "".join(f"\n- {rule}" for rule in rules)


def category_table(results: Results, speeds: Speeds) -> list[dict[str, Any]]:
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


def timing_note(rows: Sequence[Mapping[str, Any]]) -> str:
    """How the speedups were measured, from the rows: clock(s) and rounds."""
    timed = [r for r in rows if r["timing_clock"]]
    if not timed:
        return "no method was timed (the baseline's speedup is 1 by definition)"
    clocks = ", ".join(sorted({r["timing_clock"] for r in timed}))
    rounds = sorted({int(r["timing_rounds"]) for r in timed})
    span = str(rounds[0]) if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}"
    return (
        f"speedups measured by tuner.statistics.speed: clock {clocks}, {span} interleaved rounds per side (minimum "
        "per side), on each category's example of median prompt length; the baseline is 1 by definition"
    )


def markdown(rows: Sequence[Mapping[str, Any]], header: str) -> str:
    """The header, the timing note, Table 1 and Table 2."""
    categories = list(dict.fromkeys(r["category"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["category"]): r for r in rows}
    counts = {c: next(r for r in rows if r["category"] == c) for c in categories}
    head = "| method | " + " | ".join(f"{c} (n={counts[c]['examples']})" for c in categories) + " |"
    sep = "|---" * (len(categories) + 1) + "|"

    def table(fmt: Callable[[Mapping[str, Any]], str]) -> list[str]:
        return [head, sep] + [
            f"| {m} | " + " | ".join(fmt(cell[(m, c)]) if (m, c) in cell else "-" for c in categories) + " |"
            for m in methods
        ]

    lines = [header, "", timing_note(rows), "", "**Table 1**: score / measured TTFT speedup", ""]
    lines += table(lambda r: f"{r['score']:.2f} / {r['ttft_speedup']:.2f}x")
    lines += ["", "**Table 2**: prompt (token, layer) pairs computed / measured generation speedup", ""]
    lines += table(lambda r: f"{r['prompt_computed_pct']:.1f}% / {r['total_speedup']:.2f}x")
    return "\n".join(lines) + "\n"


def loss_table(summaries: Mapping[str, EvaluationSummary]) -> str:
    """Table 3: each method's accuracy loss against the baseline with its interval and sample count."""
    rows = {m: s for m, s in summaries.items() if m != "baseline"}
    if not rows:
        return ""
    level = round(100 * next(iter(rows.values())).loss.level)
    lines = [
        "",
        f"**Table 3**: accuracy loss against the baseline on the same examples (score points, macro over "
        f"datasets; {level}% paired bootstrap interval over examples, one-sided {level}% upper bound)",
        "",
        "| method | n | loss | interval | upper bound |",
        "|---|---|---|---|---|",
    ]
    for method, summ in rows.items():
        loss = summ.loss
        lines.append(
            f"| {method} | {summ.n_examples} | {loss.value:.2f} | [{loss.low:.2f}, {loss.high:.2f}] "
            f"| {loss.upper:.2f} |"
        )
    return "\n".join(lines) + "\n"


def figure(rows: Sequence[Mapping[str, Any]]) -> Figure:
    """Score against measured TTFT speedup on all datasets of the task, one point per method."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        if r["category"] != "all":
            continue
        ax.scatter(r["ttft_speedup"], r["score"], s=60)
        ax.annotate(r["method"], (r["ttft_speedup"], r["score"]), textcoords="offset points", xytext=(5, 5))
    clocks = ", ".join(sorted({r["timing_clock"] for r in rows if r["timing_clock"]})) or "-"
    ax.set_xlabel(f"measured TTFT speedup (x, tuner.statistics.speed, clock {clocks})")
    ax.set_ylabel("score (macro over datasets)")
    ax.set_title("methods on all datasets of the task")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_report(
    out_dir: Path,
    header: str,
    results: Results,
    speeds: Speeds,
    summaries: Mapping[str, EvaluationSummary],
) -> str:
    """``report.md``, ``report.csv`` and ``report.png``; returns the markdown."""
    rows = category_table(results, speeds)
    text = markdown(rows, header) + loss_table(summaries)
    write_atomic(out_dir / "report.md", text)
    write_atomic(out_dir / "report.csv", csv_text(rows, list(rows[0])))
    write_figure(figure(rows), out_dir / "report.png")
    return text
