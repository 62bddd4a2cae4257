"""The files of ``python -m tuner.evaluate --match-speedup``, written once from its
:class:`~tuner.evaluation.matched.MatchedReport`:

    matched.md    the matched-speed table, each method's scoring rule, the matched-loss table, every point
    matched.csv   one row per point (losses are reference - point, score points, positive = worse)
    matched.png   score against FLOP-model and measured TTFT speedup, a curve per method, tuned on top

Every file is written under a temporary name and moved into place (:mod:`lazyllm.atomic`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lazyllm.atomic import write_atomic
from tuner.evaluation.matched import MatchedReport
from tuner.report.figure import pyplot, write_figure
from tuner.report.table import csv_text
from tuner.statistics.bootstrap import Estimate
from tuner.study.settings import EvaluateSettings

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def interval_text(est: Estimate) -> str:
    """``+1.25 [-0.50, +3.00]``: a loss and its interval, score points."""
    return f"{est.value:+.2f} [{est.low:+.2f}, {est.high:+.2f}]"


def rows(report: MatchedReport) -> list[dict[str, Any]]:
    """One CSV row per point; losses are reference - point (score points, positive = worse)."""
    out = []
    for p in report.points:
        row: dict[str, Any] = {
            "label": p.label,
            "method": p.method,
            "role": p.role,
            "options": json.dumps(p.options, sort_keys=True),
            "n": p.n,
            "score": round(p.score, 2),
        }
        for name, est in (("loss_vs_baseline", p.vs_baseline), ("loss_vs_tuned", p.vs_tuned)):
            row[name] = None if est is None else round(est.value, 2)
            row[f"{name}_low"] = None if est is None else round(est.low, 2)
            row[f"{name}_high"] = None if est is None else round(est.high, 2)
        row.update(
            interval_level=report.level,
            flop_speedup=round(p.flop_speedup, 3),
            ttft_speedup=round(p.ttft_speedup, 3),
            timing_clock=p.speed.clock if p.speed else "",
            timing_rounds=p.speed.ttft.rounds if p.speed else 0,
        )
        out.append(row)
    return out


def markdown(report: MatchedReport, header: str) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    def vs(est: Estimate | None) -> str:
        return "-" if est is None else interval_text(est)

    timed = [p.speed for p in report.points if p.speed is not None]
    clocks = ", ".join(sorted({s.clock for s in timed})) or "-"
    rounds = sorted({s.ttft.rounds for s in timed}) or [0]
    timing = (
        f"measured TTFT speedups by tuner.statistics.speed: clock {clocks}, "
        f"{rounds[0] if len(rounds) == 1 else f'{rounds[0]}-{rounds[-1]}'} interleaved rounds per side "
        f"(minimum per side) on the example of median prompt length"
    )
    lines = [
        header,
        "",
        f"**Matched speed**: every peer's size knob set to the tuned schedule's FLOP-model speedup "
        f"{report.target_flop_speedup:.2f}x (n = {report.n} examples; unpruned score "
        f"{report.baseline_score:.2f}; loss = reference - method in score points, positive = worse, "
        f"{report.level:.0%} paired bootstrap interval as in Table 3; {timing})",
        "",
        "| method | knobs | n | score | loss vs unpruned | loss vs tuned | FLOP speedup | measured TTFT speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in report.points:
        if p.role not in ("tuned", "matched"):
            continue
        knobs = ", ".join(f"{k}={v:g}" for k, v in sorted(p.options.items())) or "-"
        lines.append(
            f"| {p.label if p.role == 'matched' else 'tuned schedule (lazyllm)'} | {knobs} | {p.n} | "
            f"{p.score:.2f} | {vs(p.vs_baseline)} | {vs(p.vs_tuned)} | {p.flop_speedup:.2f}x | "
            f"{p.ttft_speedup:.2f}x |"
        )
    for method, best in report.unreachable.items():
        lines.append(f"| {method} | - | - | unreachable: at most {best:.2f}x with one token kept | | | | |")
    if report.rules:
        lines += ["", "**Scoring rules**", ""]
        lines += [f"- {method}: {rule}" for method, rule in report.rules.items()]
    lines += [
        "",
        f"**Matched loss**: each method's speedup at the tuned schedule's loss "
        f"({report.tuned.loss:+.2f} points), read off its knob sweep",
        "",
        "| method | FLOP speedup at that loss | measured TTFT speedup at that loss |",
        "|---|---|---|",
        f"| tuned schedule | {report.tuned.flop_speedup:.2f}x | {report.tuned.ttft_speedup:.2f}x |",
    ]
    for method, speeds in report.at_loss.items():
        lines.append(f"| {method} | {fmt(speeds['flop_speedup'])} | {fmt(speeds['ttft_speedup'])} |")
    lines += [
        "",
        "**All points** (also in matched.csv)",
        "",
        "| point | n | score | loss vs unpruned | loss vs tuned | FLOP | TTFT |",
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for p in report.points:
        lines.append(
            f"| {p.label} | {p.n} | {p.score:.2f} | {vs(p.vs_baseline)} | {vs(p.vs_tuned)} | "
            f"{p.flop_speedup:.2f}x | {p.ttft_speedup:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def figure(report: MatchedReport, title: str) -> Figure:
    """Score vs speedup, FLOP model (left) and measured TTFT (right): a curve per method, tuned on top."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    methods = list(dict.fromkeys(p.method for p in report.points if p.role != "tuned"))
    for ax, kind, name in zip(
        axes, ("flop_speedup", "ttft_speedup"), ("FLOP-model prefill", "measured TTFT")
    ):
        for i, method in enumerate(methods):
            curve = sorted((p for p in report.points if p.method == method), key=lambda p: getattr(p, kind))
            xs = [getattr(p, kind) for p in curve]
            ax.plot(xs, [p.score for p in curve], "o-", c=f"C{i}", label=method, alpha=0.8)
            for p in curve:
                if p.role == "matched":
                    ax.scatter(getattr(p, kind), p.score, s=110, facecolors="none", edgecolors=f"C{i}")
        t = report.tuned
        ax.scatter(getattr(t, kind), t.score, marker="*", s=260, c="k", zorder=5, label="tuned schedule")
        ax.axhline(report.baseline_score, ls="--", c="gray", lw=1, label="unpruned")
        what = (
            "median over examples"
            if kind == "flop_speedup"
            else "tuner.statistics.speed, median-length example"
        )
        ax.set_xlabel(f"{name} speedup (x, {what})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("score (macro over datasets)")
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(
        f"{title}: n = {report.n} examples per point (circled: matched to the tuned speedup)", fontsize=10
    )
    fig.tight_layout()
    return fig


def write(report: MatchedReport, out_dir: Path, header: str, title: str) -> str:
    """``matched.md``, ``matched.csv``, ``matched.png``; returns the markdown."""
    text = markdown(report, header)
    write_atomic(out_dir / "matched.md", text)
    table = rows(report)
    write_atomic(out_dir / "matched.csv", csv_text(table, list(table[0])))
    write_figure(figure(report, title), out_dir / "matched.png")
    return text


def header(settings: EvaluateSettings) -> str:
    """What the comparison ran on (the first line of ``matched.md``)."""
    return (
        f"model {settings.model}, task {settings.task} ({settings.language}), split {settings.split}, "
        f"prompts cut to {settings.max_prompt_tokens} tokens, schedule {settings.schedule}"
    )


def title(settings: EvaluateSettings) -> str:
    """The figure's title: model, task and split."""
    return f"{settings.model_slug} {settings.task} {settings.split}"
