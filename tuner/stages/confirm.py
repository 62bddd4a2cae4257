"""The confirmation stage: re-score the best feasible candidates on the task before recommending.

The search ranks schedules by a cheap, low-noise signal (fidelity) or by the task score; either way
its pick may be lucky. Here the top ``k`` records of the **feasible** front (fastest first) are
evaluated with the LongBench task score on **every** validation example, and the task-score loss gets
a paired bootstrap interval against the baseline. Racing:

* candidates run fastest first; the first whose one-sided upper bound of task-score loss is within
  the user's budget (``max_accuracy_loss`` score points) is **confirmed** and becomes the
  recommendation (nothing slower can be recommended over it, so the slower candidates are **skipped**);
* a candidate stops early (**failed**) once its loss cannot meet the budget even if every remaining
  example scored perfectly; one that runs to the end over budget is **failed** too;
* a record of an ``accuracy="score"`` study already scored on every validation example is not re-run.

The stage returns a :class:`Confirmation`; it writes nothing. The session stores it in the study
(user attr ``"confirmation"``, so ``tuner.export`` finds the same pick later) and the report writes
``confirmation.json`` and ``recommended.json`` from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.losses import ScoreLoss
from tuner.records import TrialRecord
from tuner.stages.front import feasible_front
from tuner.stages.trial import TrialRunner
from tuner.stats import Estimate

STATUSES = ("confirmed", "failed", "skipped")
CONFIRMATION_ATTR = "confirmation"
"""Study user attr holding the last confirmation (:meth:`Confirmation.to_dict`)."""


@dataclass(frozen=True)
class CandidateResult:
    """One candidate of the confirmation stage.

    Attributes:
        trial: Optuna trial number.
        percentiles: its schedule's percentiles (for people reading the JSON).
        speedup: its speed objective from the search.
        search_loss: its loss from the search, in the search loss's unit.
        status: ``confirmed``, ``failed`` or ``skipped`` (a faster candidate was confirmed).
        loss: task-score loss (score points) on all validation examples (None when skipped or
            stopped early).
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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CandidateResult:
        task = data.get("task_loss")
        return cls(
            trial=int(data["trial"]),
            percentiles=tuple(float(p) for p in data["percentiles"]),
            speedup=float(data["speedup"]),
            search_loss=float(data["search_loss"]),
            status=str(data["status"]),
            loss=None if task is None else Estimate.from_dict(task),
            reason=str(data["reason"]),
        )


@dataclass(frozen=True)
class Confirmation:
    """The confirmation stage's outcome: every candidate, the recommended trial (None if none passed),
    and how many complete trials the study held when it ran (a later trial makes it stale)."""

    budget: float
    level: float
    candidates: tuple[CandidateResult, ...]
    n_examples: int
    complete_trials: int

    @property
    def recommended(self) -> CandidateResult | None:
        return next((c for c in self.candidates if c.status == "confirmed"), None)

    def to_dict(self) -> dict[str, Any]:
        rec = self.recommended
        return {
            "budget": self.budget,
            "unit": ScoreLoss.unit,
            "level": self.level,
            "n_examples": self.n_examples,
            "complete_trials": self.complete_trials,
            "recommended_trial": None if rec is None else rec.trial,
            "candidates": [c.to_dict() for c in self.candidates],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Confirmation:
        return cls(
            budget=float(data["budget"]),
            level=float(data["level"]),
            candidates=tuple(CandidateResult.from_dict(c) for c in data.get("candidates", [])),
            n_examples=int(data["n_examples"]),
            complete_trials=int(data.get("complete_trials", -1)),
        )

    def store(self, study: optuna.Study) -> None:
        study.set_user_attr(CONFIRMATION_ATTR, self.to_dict())

    @classmethod
    def of_study(cls, study: optuna.Study) -> Confirmation | None:
        """The study's stored confirmation if it judged the study's current complete trials."""
        data = study.user_attrs.get(CONFIRMATION_ATTR)
        if not isinstance(data, dict):
            return None
        current = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
        try:
            found = cls.from_dict(data)
        except (KeyError, TypeError, ValueError):
            return None  # an older or damaged attr: as if never confirmed
        return found if found.complete_trials == current else None


def _reusable(record: TrialRecord, n_examples: int) -> Estimate | None:
    """A score-mode record that already covers every validation example."""
    if record.accuracy == "score" and len(record.per_example) == n_examples:
        return record.loss
    return None


def confirm(records: list[TrialRecord], runner: TrialRunner, k: int, complete_trials: int) -> Confirmation:
    """Race the top ``k`` feasible front records (fastest first) on the task score; see the module docstring."""
    budget = ScoreLoss(runner.settings.max_accuracy_loss)
    n = len(runner.evaluator.examples)
    out: list[CandidateResult] = []
    done = False
    for r in feasible_front(records, runner.search_loss)[:k]:

        def result(status: str, loss: Estimate | None, reason: str, r: TrialRecord = r) -> CandidateResult:
            speedup, search_loss = r.values
            return CandidateResult(
                r.number, r.schedule.percentiles, speedup, search_loss, status, loss, reason
            )

        if done:
            out.append(result("skipped", None, "a faster candidate was confirmed"))
            continue
        est = _reusable(r, n)
        if est is None:
            scored = budget.measure(runner, runner.engine(r.schedule), f"confirm trial {r.number}")
            if scored.estimate is None:
                out.append(result("failed", None, str(scored.stopped)))
                continue
            est = scored.estimate
        done = budget.within(est)
        why = (
            f"task-score loss {est.text()} score points; upper bound {est.upper:.2f} "
            f"{'<=' if done else '>'} budget {budget.budget:g}"
        )
        out.append(result("confirmed" if done else "failed", est, why))
    return Confirmation(
        budget=budget.budget,
        level=runner.settings.confidence,
        candidates=tuple(out),
        n_examples=n,
        complete_trials=complete_trials,
    )
