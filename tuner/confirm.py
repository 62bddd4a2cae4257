"""Confirmation after the search: re-score the best feasible candidates on the task before recommending.

The search ranks schedules by a cheap, low-noise signal (fidelity) or by the task score; either way
its pick may be lucky. Here the top ``k`` trials of the **feasible** front (fastest first) are
evaluated with the LongBench task score on **every** validation example, and the accuracy loss gets
a paired bootstrap interval against the baseline (:func:`tuner.evaluation.loss_estimate`). Racing:

* candidates run fastest first; the first whose one-sided upper bound of task-score loss is within
  ``max_accuracy_loss`` is **confirmed** and becomes ``recommended.json`` (nothing slower can be
  recommended over it, so the slower candidates are **skipped**);
* a candidate stops early (**failed**) once its loss cannot meet the budget even if every remaining
  example scored perfectly; one that runs to the end over budget is **failed** too;
* a trial of a ``accuracy="score"`` study already scored on all validation examples is not re-run.

The evidence (each candidate's status, loss estimate, reason) goes to ``confirmation.json``, the
study's user attrs (``"confirmation"``), the metadata of ``recommended.json``, and is merged into the
rows of ``pareto.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from lazyllm.engine import LazyLLM
from lazyllm.schedule import Schedule
from tuner.records import TrialRecord
from tuner.results import trial_schedule
from tuner.stats import Estimate
from tuner.study import CONFIRMATION_ATTR, StudyRunner, feasible_front, schedule_of

STATUSES = ("confirmed", "failed", "skipped")


@dataclass(frozen=True)
class CandidateResult:
    """One candidate of the confirmation stage.

    Attributes:
        trial: Optuna trial number.
        percentiles: its schedule.
        speedup: its speed objective from the search.
        search_loss: its accuracy objective from the search (KL or score points).
        status: ``confirmed``, ``failed`` or ``skipped`` (a faster candidate was confirmed).
        loss: task-score loss on all validation examples (None when skipped or stopped early).
        reason: why, in words.
    """

    trial: int
    percentiles: tuple[float, ...]
    speedup: float
    search_loss: float
    status: str
    loss: Estimate | None
    reason: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status = {self.status!r}: must be one of {', '.join(STATUSES)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "trial": self.trial,
            "percentiles": list(self.percentiles),
            "speedup": self.speedup,
            "search_loss": self.search_loss,
            "status": self.status,
            "task_loss": None if self.loss is None else self.loss.to_dict(),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Confirmation:
    """The confirmation stage's outcome: every candidate, and the recommended trial (None if none passed)."""

    budget: float
    level: float
    candidates: tuple[CandidateResult, ...]
    n_examples: int

    @property
    def recommended(self) -> CandidateResult | None:
        return next((c for c in self.candidates if c.status == "confirmed"), None)

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommended
        return {
            "budget": self.budget,
            "level": self.level,
            "n_examples": self.n_examples,
            "recommended_trial": None if rec is None else rec.trial,
            "candidates": [c.to_dict() for c in self.candidates],
        }


def _reusable(record: TrialRecord | None, n_examples: int) -> Estimate | None:
    """A score-mode record that already covers every validation example."""
    if record is not None and record.accuracy == "score" and len(record.per_example) == n_examples:
        return record.loss
    return None


def confirm(study: optuna.Study, runner: StudyRunner, k: int) -> Confirmation:
    """Race the top ``k`` feasible front trials (fastest first) on the task score; see the module docstring."""
    settings = runner.settings
    budget = settings.max_accuracy_loss
    n = len(runner.evaluator.examples)
    front: list[FrozenTrial] = feasible_front(study, budget)[:k]
    out: list[CandidateResult] = []
    done = False
    for t in front:
        sched = schedule_of(t, settings.model)

        def result(
            status: str, loss: Estimate | None, reason: str, t: FrozenTrial = t, sched: Schedule = sched
        ) -> CandidateResult:
            return CandidateResult(
                trial=t.number,
                percentiles=sched.percentiles,
                speedup=float(t.values[0]),
                search_loss=float(t.values[1]),
                status=status,
                loss=loss,
                reason=reason,
            )

        if done:
            out.append(result("skipped", None, "a faster candidate was confirmed"))
            continue
        est = _reusable(TrialRecord.from_trial(t), n)
        if est is None:
            engine = LazyLLM(runner.model, sched, tokenizer=runner.tokenizer, strict_model_name=False)
            scored = runner.score_loss(engine, f"confirm trial {t.number}")
            if scored.estimate is None:
                out.append(result("failed", None, str(scored.reason)))
                continue
            est = scored.estimate
        within = est.upper <= budget
        done = within
        why = f"task-score loss {est.text()}; upper bound {est.upper:.2f} {'<=' if within else '>'} budget {budget}"
        out.append(result("confirmed" if within else "failed", est, why))
    return Confirmation(budget=budget, level=settings.confidence, candidates=tuple(out), n_examples=n)


def record_confirmation(study: optuna.Study, result: Confirmation) -> dict[str, Any]:
    """Store the outcome in the study (user attr ``confirmation``, with the count of complete trials
    it judged): from then on :func:`tuner.study.recommended_trial` returns the confirmed trial, so
    plots, ``pareto.json``, MLflow and the registry name the same trial as ``recommended.json``."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    data = result.to_dict() | {"complete_trials": len(complete)}
    study.set_user_attr(CONFIRMATION_ATTR, data)
    return data


def write_confirmation(study: optuna.Study, result: Confirmation, out_dir: Path) -> Path | None:
    """``confirmation.json``, ``recommended.json`` and the ``pareto.json`` annotations (after
    :func:`record_confirmation` and a fresh export).

    Returns the path of ``recommended.json``, or None when no candidate was confirmed (the file is
    then removed: a recommendation must be confirmed).
    """
    data = result.to_dict()
    (out_dir / "confirmation.json").write_text(json.dumps(data, indent=2) + "\n")
    rec = result.recommended
    by_trial = {c.trial: c for c in result.candidates}
    pareto = out_dir / "pareto.json"
    if pareto.exists():
        rows = json.loads(pareto.read_text())
        for row in rows:
            t = study.trials[int(row["trial"])]
            record = TrialRecord.from_trial(t)
            if record is not None:
                row["accuracy_loss_interval"] = [round(record.loss.low, 4), round(record.loss.high, 4)]
                row["accuracy_loss_upper"] = round(record.loss.upper, 4)
                row["accuracy_loss_se"] = record.loss.to_dict()["se"]
            c = by_trial.get(int(row["trial"]))
            row["recommended"] = rec is not None and int(row["trial"]) == rec.trial
            row["confirmation"] = c.status if c is not None else "not a candidate"
            if c is not None and c.loss is not None:
                row["task_loss"] = round(c.loss.value, 4)
                row["task_loss_interval"] = [round(c.loss.low, 4), round(c.loss.high, 4)]
                row["task_loss_upper"] = round(c.loss.upper, 4)
        pareto.write_text(json.dumps(rows, indent=2) + "\n")
    path = out_dir / "recommended.json"
    if rec is None:
        path.unlink(missing_ok=True)
        return None
    base = trial_schedule(study, study.trials[rec.trial])
    meta = dict(base.metadata)
    meta["confirmation"] = rec.to_dict() | {
        "level": result.level,
        "budget": result.budget,
        "n_examples": result.n_examples,
    }
    return Schedule(model=base.model, percentiles=base.percentiles, metadata=meta, revival=base.revival).save(
        path
    )
