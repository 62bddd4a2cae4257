"""Study results on disk: Pareto schedules as JSON, ``recommended.json``, tables and plots.

Layout under the study folder::

    pareto/trial-<n>.json   one schedule per Pareto trial (provenance in its metadata)
    pareto.json, pareto.csv the front: trial, speedup, accuracy_loss, speedup_kind, measured TTFT and
                            FLOP-model speedups, computed %, examples run, recommended, file
    recommended.json        the fastest trial within the accuracy-loss budget
    pareto.png/.html        every trial (hollow: over budget), the front, the budget, the recommended
                            trial (star), error bars where intervals were recorded, sample counts
    keep_curves.png/.html   percent of prompt tokens computed per layer: the recommended schedule
                            (bold), the rest of the front, and the best hand-made one once known

Names match the MLflow metrics and Optuna's metric names (``speedup``, ``accuracy_loss``).
"""

from __future__ import annotations

import base64
import csv
import html
import json
import re
import shutil
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

import lazyllm
from lazyllm.schedule import Schedule
from tuner.study import pareto_trials, recommended_trial, schedule_of


def provenance(study: optuna.Study, trial: FrozenTrial, split: str = "validation") -> dict[str, Any]:
    identity = study.user_attrs.get("identity", {})
    return {
        "source": "lazyllm-tuner",
        "study": study.study_name,
        "trial": trial.number,
        "model": identity.get("model"),
        "task": identity.get("task"),
        "split": split,
        "search_space": identity.get("search_space"),
        "metrics": {
            "speedup": trial.values[0],
            "speedup_kind": identity.get("speedup", "measured"),
            "accuracy_loss": trial.values[1],
            "measured_ttft_speedup": trial.user_attrs.get("measured_ttft_speedup"),
            "flop_speedup": trial.user_attrs.get("flop_speedup"),
            "prompt_computed_pct": trial.user_attrs.get("prompt_computed_pct"),
            "score": trial.user_attrs.get("score"),
            "baseline_score": trial.user_attrs.get("baseline_score"),
        },
        "settings": {k: v for k, v in identity.items() if k not in ("model", "task")},
        "lazyllm_version": lazyllm.__version__,
    }


def trial_schedule(study: optuna.Study, trial: FrozenTrial) -> Schedule:
    model = study.user_attrs.get("identity", {}).get("model", "unknown")
    base = schedule_of(trial, model)
    return Schedule(
        model=base.model,
        percentiles=base.percentiles,
        metadata=provenance(study, trial),
        revival=base.revival,
    )


def _html(title: str, png: Path, table_rows: list[dict[str, Any]], note: str = "") -> str:
    img = base64.b64encode(png.read_bytes()).decode()
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in (table_rows[0] if table_rows else {}))
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in table_rows
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(note)}</p>"
        f"<img src='data:image/png;base64,{img}' alt='{html.escape(title)}'/>"
        f"<table border='1'><tr>{head}</tr>{body}</table></body></html>\n"
    )


def sample_note(study: optuna.Study) -> str:
    """How many examples stand behind each point: the evaluation's example count and the trial count."""
    identity = study.user_attrs.get("identity", {})
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
    runs = sorted({int(t.user_attrs["examples_run"]) for t in done if "examples_run" in t.user_attrs})
    examples = "/".join(map(str, runs)) if runs else "?"
    per = identity.get("n_examples")
    per_text = "all" if per is None else str(per)
    return (
        f"n = {examples} validation examples per point ({per_text} per dataset of {identity.get('task', '?')}), "
        f"{len(done)} complete trials"
    )


def _interval(trial: FrozenTrial, key: str) -> tuple[float, float] | None:
    """A ``[low, high]`` interval the search recorded in user attr ``<key>_interval``, if any."""
    value = trial.user_attrs.get(f"{key}_interval")
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return float(value[0]), float(value[1])
    return None


def plot_pareto(
    study: optuna.Study,
    front: list[FrozenTrial],
    path: Path,
    budget: float,
    recommended: FrozenTrial | None = None,
) -> None:
    """Every complete trial (hollow when over the loss budget), the front, the budget line and the
    recommended trial (a star); error bars where a trial recorded ``speedup_interval`` /
    ``accuracy_loss_interval``; the sample counts in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
    ok = [t for t in done if t.values[1] <= budget]
    over = [t for t in done if t.values[1] > budget]
    fig, ax = plt.subplots(figsize=(7, 4.8))
    ax.scatter(
        [t.values[0] for t in ok], [t.values[1] for t in ok], c="gray", s=22, label="trials within budget"
    )
    if over:
        ax.scatter([t.values[0] for t in over], [t.values[1] for t in over], facecolors="none",
                   edgecolors="gray", s=22, label="trials over budget")  # fmt: skip
    for t in done:
        xs, ys = _interval(t, "speedup"), _interval(t, "accuracy_loss")
        if xs or ys:
            x, y = t.values
            ax.errorbar(x, y, xerr=None if xs is None else [[x - xs[0]], [xs[1] - x]],
                        yerr=None if ys is None else [[y - ys[0]], [ys[1] - y]], c="gray", lw=0.8, capsize=2)  # fmt: skip
    ax.plot([t.values[0] for t in front], [t.values[1] for t in front], "o-", c="C0", label="Pareto front")
    for t in front:
        ax.annotate(
            str(t.number), (t.values[0], t.values[1]), textcoords="offset points", xytext=(4, 4), fontsize=8
        )
    ax.axhline(budget, ls="--", c="C3", lw=1, label=f"loss budget {budget:g}")
    if recommended is not None:
        ax.scatter([recommended.values[0]], [recommended.values[1]], marker="*", s=260, c="C1",
                   edgecolors="black", zorder=5, label=f"recommended: trial {recommended.number}")  # fmt: skip
    kind = study.user_attrs.get("identity", {}).get("speedup", "measured")
    ax.set_xlabel(f"speedup ({'measured TTFT' if kind == 'measured' else 'FLOP model'}, x)")
    ax.set_ylabel("accuracy_loss (score points)")
    ax.set_title(f"{study.study_name}\n{sample_note(study)}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_keep_curves(
    schedules: dict[str, Schedule], path: Path, title: str = "", emphasis: tuple[str, ...] = ()
) -> None:
    """Share of prompt tokens computed per layer (percent); ``emphasis`` labels are drawn bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.8))
    for label, s in schedules.items():
        bold = label in emphasis
        ax.step(range(s.num_layers), [100.0 * f for f in s.keep_fractions()], where="post", label=label,
                lw=2.5 if bold else 1.0, ls="-" if bold or not label.startswith("hand-made") else "--",
                alpha=1.0 if bold else 0.6)  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("layer")
    ax.set_ylabel("prompt tokens computed (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title or "Keep curves", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def hand_made_schedule(label: str, model: str, num_layers: int) -> Schedule | None:
    """The hand-made schedule ``tuner.search``'s held-out check names ``paper start=S keep=K``."""
    match = re.fullmatch(r"paper start=(\d+) keep=([0-9.]+)", label)
    if match is None:
        return None
    start, keep = int(match[1]), float(match[2])
    stages = max(1, min(4, num_layers - 1 - start))
    return Schedule.progressive(model, num_layers, start_layer=start, final_keep=keep, stages=stages)


def render_plots(study: optuna.Study, out_dir: Path, max_accuracy_loss: float) -> list[Path]:
    """``pareto.png/.html`` and ``keep_curves.png/.html`` (with the best hand-made schedule once
    ``heldout.json`` names it); returns the files written."""
    front = pareto_trials(study)
    if not front:
        return []
    best = recommended_trial(study, max_accuracy_loss)
    rows = json.loads((out_dir / "pareto.json").read_text()) if (out_dir / "pareto.json").exists() else []
    note = sample_note(study)
    plot_pareto(study, front, out_dir / "pareto.png", max_accuracy_loss, best)
    (out_dir / "pareto.html").write_text(
        _html(f"Pareto front: {study.study_name}", out_dir / "pareto.png", rows, note)
    )
    schedules: dict[str, Schedule] = {}
    emphasis = []
    if best is not None:
        label = f"recommended: trial {best.number} ({best.values[0]:.2f}x, loss {best.values[1]:.2f})"
        schedules[label] = trial_schedule(study, best)
        emphasis.append(label)
    for t in front:
        if best is None or t.number != best.number:
            schedules[f"trial {t.number} ({t.values[0]:.2f}x, loss {t.values[1]:.2f})"] = trial_schedule(
                study, t
            )
    heldout = out_dir / "heldout.json"
    if heldout.exists() and schedules:
        name = str(json.loads(heldout.read_text()).get("best_hand_made", ""))
        first = next(iter(schedules.values()))
        hand = hand_made_schedule(name, first.model, first.num_layers)
        if hand is not None:
            schedules[f"hand-made: {name}"] = hand
            emphasis.append(f"hand-made: {name}")
    plot_keep_curves(
        schedules, out_dir / "keep_curves.png", f"Keep curves: {study.study_name}\n{note}", tuple(emphasis)
    )
    (out_dir / "keep_curves.html").write_text(
        _html(f"Keep curves: {study.study_name}", out_dir / "keep_curves.png", rows, note)
    )
    return [out_dir / n for n in ("pareto.png", "pareto.html", "keep_curves.png", "keep_curves.html")]


_COLUMNS = ("trial", "speedup", "accuracy_loss", "speedup_kind", "measured_ttft_speedup", "flop_speedup",
            "prompt_computed_pct", "examples_run", "recommended", "file")  # fmt: skip


def export_study(study: optuna.Study, out_dir: Path, max_accuracy_loss: float) -> dict[str, Any]:
    """Write the layout above (replacing an earlier export); returns what was written.

    ``pareto.json`` / ``.csv`` use the names of the MLflow metrics and Optuna's metric names
    (``speedup``, ``accuracy_loss``; ``speedup_kind`` says measured TTFT or FLOP model)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    front = pareto_trials(study)
    best = recommended_trial(study, max_accuracy_loss)
    kind = study.user_attrs.get("identity", {}).get("speedup", "measured")
    pareto_dir = out_dir / "pareto"
    shutil.rmtree(pareto_dir, ignore_errors=True)
    pareto_dir.mkdir()
    rows: list[dict[str, Any]] = []

    def num(t: FrozenTrial, key: str, digits: int) -> float:
        return round(float(t.user_attrs.get(key, float("nan"))), digits)

    for t in front:
        file = trial_schedule(study, t).save(pareto_dir / f"trial-{t.number}.json")
        rows.append(
            {
                "trial": t.number,
                "speedup": round(t.values[0], 4),
                "accuracy_loss": round(t.values[1], 4),
                "speedup_kind": kind,
                "measured_ttft_speedup": num(t, "measured_ttft_speedup", 4),
                "flop_speedup": num(t, "flop_speedup", 4),
                "prompt_computed_pct": num(t, "prompt_computed_pct", 2),
                "examples_run": int(t.user_attrs.get("examples_run", 0)),
                "recommended": best is not None and t.number == best.number,
                "file": str(file.relative_to(out_dir)),
            }
        )
    (out_dir / "pareto.json").write_text(json.dumps(rows, indent=2) + "\n")
    with (out_dir / "pareto.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    recommended = None
    if best is not None:
        recommended = trial_schedule(study, best).save(out_dir / "recommended.json")
    else:
        (out_dir / "recommended.json").unlink(missing_ok=True)
    render_plots(study, out_dir, max_accuracy_loss)
    return {"front": rows, "recommended": recommended, "recommended_trial": best.number if best else None}
