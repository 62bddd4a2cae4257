"""Figures of a study, from its :class:`~tuner.stages.outcome.StudyOutcome`; each states its sample counts
and takes its loss axis label and budget line from the study's loss object (its unit)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lazyllm.schedule import Schedule
from tuner.report.figure import pyplot, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tuner.stages.outcome import StudyOutcome


def plot_pareto(outcome: StudyOutcome, path: Path) -> None:
    """:func:`pareto_figure` saved as a PNG at ``path``."""
    save_figure(pareto_figure(outcome), path)


def pareto_figure(outcome: StudyOutcome) -> Figure:
    """Every complete trial (hollow when over the search budget), the front, the budget line, the
    recommended trial (a star), loss intervals as error bars, and the sample counts in the title."""
    plt = pyplot()
    loss = outcome.search_loss
    done = outcome.complete
    ok = [r for r in done if r.loss is not None and loss.within(r.loss)]
    over = [r for r in done if r not in ok]
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ax.scatter(
        [r.values[0] for r in ok], [r.values[1] for r in ok], c="gray", s=22, label="trials within budget"
    )
    if over:
        ax.scatter([r.values[0] for r in over], [r.values[1] for r in over], facecolors="none",
                   edgecolors="gray", s=22, label="trials over budget")  # fmt: skip
    for r in done:
        assert r.loss is not None
        x, y = r.values
        ax.errorbar(x, y, yerr=[[y - r.loss.low], [r.loss.high - y]], c="gray", lw=0.8, capsize=2)
    front = outcome.front
    ax.plot([r.values[0] for r in front], [r.values[1] for r in front], "o-", c="C0", label="Pareto front")
    for r in front:
        ax.annotate(str(r.number), r.values, textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axhline(loss.budget, ls="--", c="C3", lw=1, label=f"budget {loss.text(loss.budget)} (upper bound)")
    best = outcome.recommended
    if best is not None:
        state = "provisional" if outcome.provisional else "confirmed"
        ax.scatter([best.values[0]], [best.values[1]], marker="*", s=260, c="C1", edgecolors="black",
                   zorder=5, label=f"recommended ({state}): trial {best.number}")  # fmt: skip
    kind = outcome.identity.speedup
    what = {"measured": "measured TTFT", "total": "measured whole generation", "flops": "FLOP model"}
    ax.set_xlabel(f"speedup ({what.get(kind, kind)}, x)")
    ax.set_ylabel(loss.label)
    ax.set_title(f"{outcome.study_name}\n{outcome.sample_note()}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def keep_curve_schedules(outcome: StudyOutcome) -> tuple[dict[str, Schedule], tuple[str, ...]]:
    """The schedules of the keep-curve plot by label, and the labels drawn bold: the recommendation,
    the rest of the front, and the best hand-made schedule of each family once the held-out check ran."""
    unit = outcome.search_loss
    schedules: dict[str, Schedule] = {}
    emphasis: list[str] = []
    best = outcome.recommended
    if best is not None:
        label = f"recommended: trial {best.number} ({best.values[0]:.2f}x, loss {unit.text(best.values[1])})"
        schedules[label] = best.schedule
        emphasis.append(label)
    for r in outcome.front:
        if best is None or r.number != best.number:
            schedules[f"trial {r.number} ({r.values[0]:.2f}x, loss {unit.text(r.values[1])})"] = r.schedule
    if outcome.heldout is not None:
        for family, c in outcome.heldout.best_hand_made.items():
            label = f"hand-made {family}: {c.name}"
            schedules[label] = c.schedule
            emphasis.append(label)
    return schedules, tuple(emphasis)


def plot_keep_curves(
    schedules: dict[str, Schedule], path: Path, title: str = "", emphasis: tuple[str, ...] = ()
) -> None:
    """Share of prompt tokens computed per layer (percent); ``emphasis`` labels are drawn bold."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4.8))
    for label, s in schedules.items():
        bold = label in emphasis
        ax.step(range(s.num_layers), [100.0 * f for f in s.keep_fractions()], where="post", label=label,
                lw=2.5 if bold else 1.0, ls="--" if label.startswith("hand-made") else "-",
                alpha=1.0 if bold else 0.6)  # fmt: skip
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer")
    ax.set_ylabel("prompt tokens computed (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title or "Keep curves", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def calibration_figure(outcome: StudyOutcome) -> Figure | None:
    """Each task-scored schedule's mean KL against its task-score loss (with its interval), the
    pooled fit, its one-sided bound, the budget and the KL cap it implies; None without a calibration."""
    conf = outcome.confirmation
    if conf is None or conf.calibration is None:
        return None
    cal = conf.calibration
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.8))
    for c in conf.candidates:
        if c.loss is None:
            continue
        ax.errorbar(c.search_loss, c.loss.value, yerr=[[c.loss.value - c.loss.low], [c.loss.high - c.loss.value]],
                    fmt="o", c="C0", capsize=3)  # fmt: skip
        ax.annotate(
            str(c.trial), (c.search_loss, c.loss.value), textcoords="offset points", xytext=(4, 4), fontsize=8
        )
    top = max([cal.max_scored_kl, *(p[1] for p in cal.points)]) * 1.15 or 1.0
    xs = [top * i / 64 for i in range(65)]  # a concave calibration (exponent < 1) is a curve
    ax.plot(xs, [cal.predicted(x)[0] for x in xs], c="C0", label=f"pooled fit: {cal.slope:.1f} {cal.unit}")
    ax.plot(xs, [cal.predicted(x)[1] for x in xs], c="C0", ls=":",
            label=f"{cal.level:.0%} upper bound: {cal.slope_upper:.1f} {cal.unit}")  # fmt: skip
    ax.axhline(conf.budget, ls="--", c="C3", lw=1, label=f"budget {conf.budget:g} score points")
    ax.axvline(
        cal.max_kl(conf.budget), ls="--", c="gray", lw=1, label=f"KL cap {cal.max_kl(conf.budget):.4f} nats"
    )
    ax.set_xlabel(f"{outcome.search_loss.what} ({outcome.search_loss.unit})")
    ax.set_ylabel("task-score loss (score points)")
    ax.set_title(
        f"Calibration: {outcome.study_name}\n{len(cal.trials)} schedules x n = {cal.n_examples} validation examples",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
