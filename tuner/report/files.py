"""A study's files, written once from its :class:`~tuner.stages.outcome.StudyOutcome`.

Layout under the study folder::

    pareto/trial-<n>.json   one schedule per Pareto trial (provenance in its metadata)
    pareto.json, pareto.csv the front: trial, speedup, accuracy_loss with its unit and interval,
                            FLOP-model speedup, computed %, examples run, confirmation status, file
    recommended.json        the recommendation (see tuner.stages.outcome); absent when there is none
    confirmation.json       the confirmation stage's evidence (when it ran)
    heldout.json            the held-out check (when it ran)
    pareto.png/.html        every trial, the front, the budget, the recommendation, sample counts
    calibration.png/.html   task loss against KL of the scored schedules, the pooled fit and its bound
    keep_curves.png/.html   percent of prompt tokens computed per layer: the recommendation (bold),
                            the rest of the front, and the best hand-made schedules once known

Every file is written under a temporary name of its own and moved into place, so an interrupted
run never leaves a truncated file; an export replaces the files of an earlier one. Workers sharing a
storage may finish at the same moment and write the same folder: each write holds an exclusive lock
on the folder (where the system offers ``flock``), so the files always come from one outcome.
"""

from __future__ import annotations

import base64
import html
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lazyllm.atomic import replace_with, write_atomic
from tuner.report.figure import save_figure
from tuner.report.heldout import heldout_json
from tuner.report.plots import (
    calibration_figure,
    keep_curve_schedules,
    plot_keep_curves,
    plot_pareto,
)
from tuner.report.table import csv_text
from tuner.stages.outcome import StudyOutcome

COLUMNS = ("trial", "speedup", "speedup_kind", "accuracy_loss", "accuracy_loss_unit", "accuracy_loss_interval",
           "accuracy_loss_upper", "flop_speedup", "prompt_computed_pct", "examples_run", "recommended",
           "confirmation", "task_loss", "task_loss_interval", "task_loss_upper", "file")  # fmt: skip


@contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the folder itself (no lock file is left behind)."""
    try:
        import fcntl
    except ImportError:  # no flock here: each file is still atomic, the set may mix two outcomes
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _json(path: Path, data: Any) -> Path:
    return write_atomic(path, json.dumps(data, indent=2) + "\n")


def front_rows(outcome: StudyOutcome) -> list[dict[str, Any]]:
    """One row per front member (the ``pareto.json`` / ``.csv`` rows), fastest first."""
    best = outcome.recommended
    candidates = {c.trial: c for c in outcome.confirmation.candidates} if outcome.confirmation else {}
    rows = []
    for r in outcome.front:
        assert r.loss is not None
        c = candidates.get(r.number)
        task = c.loss if c is not None else None
        rows.append(
            {
                "trial": r.number,
                "speedup": round(r.values[0], 4),
                "speedup_kind": outcome.identity.speedup,
                "accuracy_loss": round(r.loss.value, 4),
                "accuracy_loss_unit": outcome.search_loss.unit,
                "accuracy_loss_interval": [round(r.loss.low, 4), round(r.loss.high, 4)],
                "accuracy_loss_upper": round(r.loss.upper, 4),
                "flop_speedup": round(r.flop_speedup, 4),
                "prompt_computed_pct": round(r.prompt_computed_pct, 2),
                "examples_run": r.examples_run,
                "recommended": best is not None and r.number == best.number,
                "confirmation": c.status if c is not None else "not a candidate",
                "task_loss": None if task is None else round(task.value, 4),
                "task_loss_interval": None if task is None else [round(task.low, 4), round(task.high, 4)],
                "task_loss_upper": None if task is None else round(task.upper, 4),
                "file": f"pareto/trial-{r.number}.json",
            }
        )
    return rows


def _html(title: str, png: Path, rows: list[dict[str, Any]], note: str) -> str:
    img = base64.b64encode(png.read_bytes()).decode()
    head = "".join(f"<th>{html.escape(str(k))}</th>" for k in (rows[0] if rows else {}))
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>" for r in rows
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(note)}</p>"
        f"<img src='data:image/png;base64,{img}' alt='{html.escape(title)}'/>"
        f"<table border='1'><tr>{head}</tr>{body}</table></body></html>\n"
    )


def _pareto_folder(outcome: StudyOutcome, out_dir: Path) -> None:
    """``pareto/`` replaced as a whole: built beside, then swapped in."""
    fresh = Path(tempfile.mkdtemp(dir=out_dir, prefix=".pareto.", suffix=".tmp"))
    try:
        for r in outcome.front:
            outcome.schedule_of(r).save(fresh / f"trial-{r.number}.json")
        old = out_dir / "pareto"
        if old.exists():
            stale = Path(tempfile.mkdtemp(dir=out_dir, prefix=".pareto.", suffix=".old"))
            old.rename(stale / "pareto")
            shutil.rmtree(stale, ignore_errors=True)
        fresh.rename(old)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise


def write_outcome(outcome: StudyOutcome, out_dir: Path) -> list[Path]:
    """Write the layout above; returns the paths written (what MLflow attaches to the parent run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with _folder_lock(out_dir):
        return _write_outcome(outcome, out_dir)


def _write_outcome(outcome: StudyOutcome, out_dir: Path) -> list[Path]:
    rows = front_rows(outcome)
    _pareto_folder(outcome, out_dir)
    written = [out_dir / "pareto", _json(out_dir / "pareto.json", rows)]
    written.append(write_atomic(out_dir / "pareto.csv", csv_text(rows, COLUMNS)))
    best = outcome.recommended
    rec_path = out_dir / "recommended.json"
    if best is not None:
        written.append(write_atomic(rec_path, outcome.schedule_of(best).to_json() + "\n"))
    else:
        rec_path.unlink(missing_ok=True)
    if outcome.confirmation is not None:
        written.append(_json(out_dir / "confirmation.json", outcome.confirmation.to_dict()))
    if outcome.heldout is not None:
        heldout = heldout_json(outcome.heldout) | {"budget_kind": outcome.budget_kind}
        for row in heldout["rows"]:  # gold score points, or agreement points for a file without answers
            row["test_loss_unit"] = outcome.points
        written.append(_json(out_dir / "heldout.json", heldout))
    if outcome.complete:
        note = outcome.sample_note()
        schedules, emphasis = keep_curve_schedules(outcome)
        figures = {
            "pareto": (f"Pareto front: {outcome.study_name}", lambda p: plot_pareto(outcome, p)),
            "keep_curves": (
                f"Keep curves: {outcome.study_name}",
                lambda p: plot_keep_curves(
                    schedules, p, f"Keep curves: {outcome.study_name}\n{note}", emphasis
                ),
            ),
        }
        calibration = calibration_figure(outcome)
        if calibration is not None:
            figures["calibration"] = (
                f"Calibration: {outcome.study_name}",
                lambda p: save_figure(calibration, p),
            )
        for name, (title, draw) in figures.items():
            png = replace_with(out_dir / f"{name}.png", draw, suffix=".png")  # drawn beside, then moved
            written.append(png)
            written.append(write_atomic(out_dir / f"{name}.html", _html(title, png, rows, note)))
    return written
