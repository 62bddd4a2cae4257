"""Study results on disk: Pareto schedules as JSON, ``recommended.json``, tables and plots.

Layout under the study folder::

    pareto/trial-<n>.json   one schedule per Pareto trial (provenance in its metadata)
    pareto.json, pareto.csv the front: trial, speedup, loss, flops speedup, computed %, file
    recommended.json        the fastest trial within the accuracy-loss budget
    pareto.png/.html        every trial, the front highlighted
    keep_curves.png/.html   per-layer keep fraction of the Pareto schedules
"""

from __future__ import annotations

import base64
import csv
import json
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
    return Schedule(model=base.model, percentiles=base.percentiles, metadata=provenance(study, trial))


def _html(title: str, png: Path, table_rows: list[dict[str, Any]]) -> str:
    img = base64.b64encode(png.read_bytes()).decode()
    head = "".join(f"<th>{k}</th>" for k in (table_rows[0] if table_rows else {}))
    body = "".join("<tr>" + "".join(f"<td>{v}</td>" for v in r.values()) + "</tr>" for r in table_rows)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head><body>"
        f"<h1>{title}</h1><img src='data:image/png;base64,{img}'/><table border='1'>"
        f"<tr>{head}</tr>{body}</table></body></html>\n"
    )


def plot_pareto(study: optuna.Study, front: list[FrozenTrial], path: Path, budget: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.scatter([t.values[0] for t in done], [t.values[1] for t in done], c="lightgray", label="trials")
    ax.plot([t.values[0] for t in front], [t.values[1] for t in front], "o-", c="C0", label="Pareto front")
    for t in front:
        ax.annotate(
            str(t.number), (t.values[0], t.values[1]), textcoords="offset points", xytext=(4, 4), fontsize=8
        )
    ax.axhline(budget, ls="--", c="C3", lw=1, label=f"loss budget {budget}")
    kind = study.user_attrs.get("identity", {}).get("speedup", "measured")
    ax.set_xlabel(f"TTFT speedup ({kind}, x)")
    ax.set_ylabel("accuracy loss (score points)")
    ax.set_title(study.study_name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_keep_curves(schedules: dict[str, Schedule], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label, s in schedules.items():
        ax.step(range(s.num_layers), s.keep_fractions(), where="post", label=label)
    ax.set_xlabel("layer")
    ax.set_ylabel("share of prompt tokens computed")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def export_study(study: optuna.Study, out_dir: Path, max_accuracy_loss: float) -> dict[str, Any]:
    """Write the layout above (replacing an earlier export); returns what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    front = pareto_trials(study)
    pareto_dir = out_dir / "pareto"
    shutil.rmtree(pareto_dir, ignore_errors=True)
    pareto_dir.mkdir()
    rows: list[dict[str, Any]] = []
    schedules: dict[str, Schedule] = {}
    for t in front:
        sched = trial_schedule(study, t)
        file = sched.save(pareto_dir / f"trial-{t.number}.json")
        schedules[f"trial {t.number} ({t.values[0]:.2f}x, loss {t.values[1]:.2f})"] = sched
        rows.append(
            {
                "trial": t.number,
                "speedup": round(t.values[0], 4),
                "accuracy_loss": round(t.values[1], 4),
                "flop_speedup": round(float(t.user_attrs.get("flop_speedup", float("nan"))), 4),
                "prompt_computed_pct": round(float(t.user_attrs.get("prompt_computed_pct", float("nan"))), 2),
                "file": str(file.relative_to(out_dir)),
            }
        )
    (out_dir / "pareto.json").write_text(json.dumps(rows, indent=2) + "\n")
    with (out_dir / "pareto.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(
            fh,
            fieldnames=["trial", "speedup", "accuracy_loss", "flop_speedup", "prompt_computed_pct", "file"],
        )
        writer.writeheader()
        writer.writerows(rows)
    best = recommended_trial(study, max_accuracy_loss)
    recommended = None
    if best is not None:
        recommended = trial_schedule(study, best).save(out_dir / "recommended.json")
    else:
        (out_dir / "recommended.json").unlink(missing_ok=True)
    if front:
        plot_pareto(study, front, out_dir / "pareto.png", max_accuracy_loss)
        (out_dir / "pareto.html").write_text(
            _html(f"Pareto front: {study.study_name}", out_dir / "pareto.png", rows)
        )
        plot_keep_curves(schedules, out_dir / "keep_curves.png")
        (out_dir / "keep_curves.html").write_text(
            _html(f"Keep curves: {study.study_name}", out_dir / "keep_curves.png", rows)
        )
    return {"front": rows, "recommended": recommended, "recommended_trial": best.number if best else None}
