"""tuner.stages.outcome and tuner.report: one outcome, every file written once from it, units everywhere."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lazyllm.schedule import Schedule
from tests.support import hand_record
from tuner.evaluation.losses import Budget, FidelityLoss, ScoreLoss
from tuner.report.console import summary_lines
from tuner.report.files import write_outcome
from tuner.report.plots import calibration_figure, keep_curve_schedules, pareto_figure
from tuner.stages.confirm import CandidateResult, Confirmation
from tuner.stages.heldout import Candidate, Comparison, HeldoutReport, HeldoutRow
from tuner.stages.outcome import StudyOutcome
from tuner.statistics.bootstrap import Estimate
from tuner.statistics.calibration import Calibration
from tuner.study.identity import StudyIdentity

IDENTITY = StudyIdentity.from_dict(
    {"model": "tiny", "task": "qa", "search_space": "stages", "speedup": "flops", "n_examples": None}
)


def _est(value: float, n: int = 13) -> Estimate:
    return Estimate(value=value, se=1.0, low=value - 2, high=value + 2, upper=value + 1.5, level=0.9, n=n)


def _outcome(**changes: object) -> StudyOutcome:
    records = (
        hand_record(0, 1.0, 0.0, (0.0, 0.0, 0.0, 0.0)),
        hand_record(1, 1.5, 0.02, (0.0, 30.0, 0.0, 0.0)),
        hand_record(2, 2.0, 0.2, (0.0, 60.0, 0.0, 0.0)),  # over the 0.05-nat budget
    )
    base = StudyOutcome("hand", IDENTITY, Budget(FidelityLoss(0.05), ScoreLoss(2.0)), records)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _confirmed(trial: int | None) -> Confirmation:
    cands = (CandidateResult(1, (0.0, 30.0, 0.0, 0.0), 1.5, 0.02, "confirmed" if trial == 1 else "failed",
                             _est(-3.66 if trial == 1 else 5.0), "why"),)  # fmt: skip
    return Confirmation(budget=2.0, level=0.9, candidates=cands, n_examples=13, complete_trials=3)


def _heldout(outcome: StudyOutcome) -> HeldoutReport:
    hand = Schedule.progressive("tiny", 4, start_layer=1, final_keep=0.3, stages=2).with_revival("frozen")
    pick = Candidate("paper start=1 keep=0.3", hand, 1.3, _est(0.03, 4))
    rec = outcome.recommended
    assert rec is not None
    rows = tuple(
        HeldoutRow(label, s, speed, loss, task, 1.2, 1.3, _est(1.0, 29), 20.0, 21.0, 13, 29)
        for label, s, speed, loss, task in (
            ("recommended", rec.schedule, rec.values[0], rec.values[1], _est(-3.66)),
            (f"best paper-style ({pick.name})", hand, 1.3, 0.03, None),
        )
    )
    return HeldoutReport(
        0.9,
        2.0,
        "nats",
        {"paper-style": pick},
        {"paper-style": [pick]},
        rows,
        (Comparison("recommended", "best paper-style", _est(-1.0)),),
    )


def test_pareto_axis_and_budget_line_come_from_the_loss() -> None:
    """Defect: in fidelity mode the y axis said "score points" and the budget line sat at 2.0."""
    fig = pareto_figure(_outcome())
    ax = fig.axes[0]
    assert ax.get_ylabel() == "accuracy loss: mean KL per answer token (nats)"
    budget_lines = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [tuple(line.get_ydata()) for line in budget_lines] == [(0.05, 0.05)]
    assert "score points" not in " ".join(t.get_text() for t in ax.get_legend().get_texts())
    score = pareto_figure(_outcome(budget=Budget(ScoreLoss(2.0), ScoreLoss(2.0))))
    assert score.axes[0].get_ylabel() == "accuracy loss: LongBench score lost (score points)"


def test_keep_curves_draw_the_best_hand_made_schedule() -> None:
    """Defect: the keep-curve plot never drew the best hand-made schedule (a regex never matched)."""
    outcome = _outcome(confirmation=_confirmed(1))
    outcome = dataclasses.replace(outcome, heldout=_heldout(outcome))
    schedules, bold = keep_curve_schedules(outcome)
    hand = [label for label in schedules if label.startswith("hand-made")]
    assert hand == ["hand-made paper-style: paper start=1 keep=0.3"] and hand[0] in bold
    assert schedules[hand[0]] == outcome.heldout.best_hand_made["paper-style"].schedule  # type: ignore[union-attr]


def test_console_summary_gives_every_loss_its_unit() -> None:
    """Defect: "validation loss -3.66" (task points) beside "validation loss 0.03" (KL), no unit."""
    outcome = _outcome(confirmation=_confirmed(1))
    lines = summary_lines(dataclasses.replace(outcome, heldout=_heldout(outcome)))
    rows = [line for line in lines if line.startswith("  recommended:") or line.startswith("  best ")]
    assert len(rows) == 2
    for line in rows:
        assert "mean KL per answer token 0.0" in line and " nats" in line  # both on the search loss
        assert "score points" in line  # the test loss names its unit
    assert "task loss -3.66 (90% interval" in rows[0]  # confirmation's task loss, labelled as such
    assert any("budget 2 score points" in line for line in lines)


def test_files_are_written_once_from_the_outcome(tmp_path: Path) -> None:
    outcome = _outcome(confirmation=_confirmed(1))
    outcome = dataclasses.replace(outcome, heldout=_heldout(outcome))
    written = write_outcome(outcome, tmp_path)
    names = sorted(p.name for p in written)
    assert names == sorted(["pareto", "pareto.json", "pareto.csv", "recommended.json", "confirmation.json",
                            "heldout.json", "pareto.png", "pareto.html", "keep_curves.png", "keep_curves.html"])  # fmt: skip
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    rows = json.loads((tmp_path / "pareto.json").read_text())
    assert [r["trial"] for r in rows] == [2, 1, 0]
    assert {r["accuracy_loss_unit"] for r in rows} == {"nats"}
    assert [r["trial"] for r in rows if r["recommended"]] == [1]
    assert rows[1]["confirmation"] == "confirmed" and rows[1]["task_loss"] == -3.66
    rec = Schedule.load(tmp_path / "recommended.json")
    assert rec.metadata["status"] == "confirmed" and rec.metadata["confirmation"]["trial"] == 1
    assert rec.metadata["metrics"]["accuracy_loss_unit"] == "nats" and str(rec.revival) == "frozen"
    assert sorted(p.name for p in (tmp_path / "pareto").iterdir()) == [
        "trial-0.json",
        "trial-1.json",
        "trial-2.json",
    ]
    heldout = json.loads((tmp_path / "heldout.json").read_text())
    assert heldout["best_hand_made"] == {"paper-style": "paper start=1 keep=0.3"}
    assert {r["validation_loss_unit"] for r in heldout["rows"]} == {"nats"}


def test_calibration_plot_shows_points_fit_bound_and_budget(tmp_path: Path) -> None:
    cal = Calibration(8.0, 12.0, 0.9, 13, (1, 2), 0.2, ((1, 0.02, 0.1), (2, 0.2, 1.7)))
    cands = tuple(
        CandidateResult(t, (0.0,), 1.5, kl, "scored", _est(loss), "why") for t, kl, loss in cal.points
    )
    outcome = _outcome(confirmation=Confirmation(2.0, 0.9, cands, 13, 3, "pooled", cal))
    fig = calibration_figure(outcome)
    assert fig is not None
    ax = fig.axes[0]
    assert (
        ax.get_xlabel() == "mean KL per answer token (nats)"
        and ax.get_ylabel() == "task-score loss (score points)"
    )
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["pooled fit: 8.0 points per nat"].get_ydata()[-1] == pytest.approx(8.0 * 0.2 * 1.15)
    assert tuple(lines["budget 2 score points"].get_ydata()) == (2.0, 2.0)
    assert tuple(lines["KL cap 0.1667 nats"].get_xdata()) == pytest.approx((2.0 / 12.0,) * 2)
    assert "2 schedules x n = 13" in ax.get_title()
    written = {p.name for p in write_outcome(outcome, tmp_path)}
    assert {"calibration.png", "calibration.html"} <= written
    assert "calibration.png" not in {p.name for p in write_outcome(_outcome(), tmp_path / "plain")}


def test_a_concave_calibration_is_drawn_as_its_curve_with_its_unit() -> None:
    cal = Calibration(8.0, 12.0, 0.9, 13, (1, 2), 0.2, ((1, 0.02, 0.1), (2, 0.2, 1.7)), exponent=0.5)
    cands = tuple(
        CandidateResult(t, (0.0,), 1.5, kl, "scored", _est(loss), "why") for t, kl, loss in cal.points
    )
    fig = calibration_figure(_outcome(confirmation=Confirmation(2.0, 0.9, cands, 13, 3, "pooled", cal)))
    assert fig is not None
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    fit, bound = (
        lines["pooled fit: 8.0 points per nat^0.5"],
        lines["90% upper bound: 12.0 points per nat^0.5"],
    )
    x, y = fit.get_xdata(), fit.get_ydata()
    assert y[-1] == pytest.approx(8.0 * (0.2 * 1.15) ** 0.5) and y[len(y) // 2] == pytest.approx(
        8.0 * x[len(x) // 2] ** 0.5
    )
    assert bound.get_ydata()[-1] == pytest.approx(12.0 * (0.2 * 1.15) ** 0.5)
    assert tuple(lines["KL cap 0.0278 nats"].get_xdata()) == pytest.approx(((2.0 / 12.0) ** 2,) * 2)


def test_recommendation_is_confirmed_provisional_or_absent(tmp_path: Path) -> None:
    provisional = _outcome()  # no confirmation ran: the fastest feasible, marked provisional
    assert provisional.recommended.number == 1 and provisional.provisional  # type: ignore[union-attr]
    write_outcome(provisional, tmp_path)
    assert Schedule.load(tmp_path / "recommended.json").metadata["status"] == "provisional"
    (tmp_path / "pareto" / "trial-99.json").write_text("{}")
    rejected = _outcome(confirmation=_confirmed(None))  # every candidate failed: no recommendation
    assert rejected.recommended is None
    write_outcome(rejected, tmp_path)
    assert not (tmp_path / "recommended.json").exists()
    assert not (tmp_path / "pareto" / "trial-99.json").exists()  # the folder is replaced as a whole


@pytest.mark.parametrize("budget", [-1.0, float("nan"), float("inf")])
def test_a_loss_refuses_a_bad_budget(budget: float) -> None:
    with pytest.raises(ValueError, match="budget"):
        FidelityLoss(budget)


_WRITER = """
import sys
from pathlib import Path
from tests.tuner.report.test_report import _outcome
from tuner.report.files import write_outcome
outcome = _outcome()
for _ in range(int(sys.argv[2])):
    write_outcome(outcome, Path(sys.argv[1]))
"""


def test_workers_writing_one_folder_at_once_never_collide(tmp_path: Path) -> None:
    """Defect (CI): two workers finishing together both built ``.pareto.tmp`` and one died of
    "File exists"; a fixed ``.pareto.png`` temporary was also renamed away under the other."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), "6"],
            cwd=root,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    assert sorted(p.name for p in (tmp_path / "pareto").iterdir()) == [
        "trial-0.json",
        "trial-1.json",
        "trial-2.json",
    ]
    assert [r["trial"] for r in json.loads((tmp_path / "pareto.json").read_text())] == [2, 1, 0]
