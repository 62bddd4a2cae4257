"""What a study concluded, as one object: its trial records, front, confirmation, held-out check and
recommendation. The session builds it once its stages have run (``tuner.export`` builds it from a
stored study); :mod:`tuner.report` writes every file from it once, and MLflow logs it. Nothing is
written, patched and read back.

**The recommendation.** After a confirmation that judged the study's current trials: the confirmed
trial (none if no candidate passed). Without one (``--confirm-k 0``, or a re-export of a study that
has more trials than its last confirmation saw): the fastest feasible trial, marked
``provisional`` in ``recommended.json``, on the console and in MLflow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna

import lazyllm
from lazyllm.schedule import Schedule
from tuner.evaluation.losses import Budget, Loss
from tuner.stages.confirm import Confirmation
from tuner.stages.front import fastest_feasible, non_dominated, study_records
from tuner.stages.heldout import HeldoutReport
from tuner.stages.target import judged_of_study
from tuner.study.identity import StudyIdentity
from tuner.study.records import TrialRecord


@dataclass(frozen=True)
class StudyOutcome:
    """A study's results.

    Attributes:
        study_name: the Optuna study name.
        identity: the settings that define the study (model, task, search space, budgets...).
        budget: the search's loss with its cap, and the user's budget in task-score points.
        records: every finished trial's record.
        confirmation: the confirmation stage's outcome, if it judged the current trials.
        heldout: the held-out check, if it ran.
        decision: what bound the answer, in words (budget, data or time).
        notes: what else the report must say (a prompts file too small for a held-out check).
        judged: a multi-fidelity study's front measured again at the target prompt length
            (:func:`tuner.stages.target.at_target`), the records the decision judged; the
            recommendation, its metrics and the decision's front read them (empty: the trial records
            themselves are what was judged). The trials' own front stays at the search length.
    """

    study_name: str
    identity: StudyIdentity
    budget: Budget
    records: tuple[TrialRecord, ...]
    confirmation: Confirmation | None = None
    heldout: HeldoutReport | None = None
    decision: str = ""
    notes: tuple[str, ...] = ()
    power: str | None = None
    judged: tuple[TrialRecord, ...] = ()

    @classmethod
    def from_study(
        cls, study: optuna.Study, budget: Budget | None = None, *, with_records: bool = True
    ) -> StudyOutcome:
        """The outcome a stored study supports (its records and still-current confirmation), under
        ``budget`` (default: the one the study was created with); ``with_records=False`` reads only
        the study's identity (provenance of one trial's schedule)."""
        identity = StudyIdentity.of_study(study)
        if identity is None:
            raise ValueError(
                f"study {study.study_name!r} has no identity: it was not created by tuner.search"
            )
        judged, note = judged_of_study(study) if with_records else ((), None)
        return cls(
            study_name=study.study_name,
            identity=identity,
            budget=Budget.from_settings(identity) if budget is None else budget,
            records=tuple(study_records(study)) if with_records else (),
            confirmation=Confirmation.of_study(study) if with_records else None,
            notes=() if note is None else (note,),
            judged=judged,
        )

    @property
    def search_loss(self) -> Loss:
        """The loss the search minimised, with its unit and cap."""
        return self.budget.search

    @property
    def task_budget(self) -> float:
        """The user's budget in task-score points."""
        return self.budget.task.budget

    @property
    def budget_kind(self) -> str:
        """``gold`` (score points against gold answers) or ``agreement`` (a prompts file without answers)."""
        return self.identity.budget_kind

    @property
    def points(self) -> str:
        """The unit of every task loss of this study."""
        return "agreement points" if self.budget_kind == "agreement" else "score points"

    def budget_line(self) -> str:
        """The budget and what its points measure, in one sentence (report, recommended.json, MLflow)."""
        if self.budget_kind == "agreement":
            return (
                f"Budget: {self.task_budget:g} agreement points (no gold answers: a pruned answer is scored "
                "against the unpruned model's own greedy answer with the row's metric; 100 = the same answers)"
            )
        return f"Budget: {self.task_budget:g} score points (the task metric against the gold answers)"

    @property
    def complete(self) -> list[TrialRecord]:
        return [r for r in self.records if r.complete]

    @property
    def front(self) -> list[TrialRecord]:
        return non_dominated(self.records)

    @property
    def judged_front(self) -> list[TrialRecord]:
        """The front the decision judged: at the target length in a multi-fidelity study."""
        return non_dominated(self.judged or self.records)

    def record(self, number: int) -> TrialRecord:
        """Trial ``number``'s record as judged (at the target length where it was measured there)."""
        return next(r for r in (*self.judged, *self.records) if r.number == number)

    @property
    def provisional(self) -> bool:
        """Whether the recommendation was not confirmed on the task score."""
        return self.confirmation is None

    @property
    def recommended(self) -> TrialRecord | None:
        if self.confirmation is not None:
            rec = self.confirmation.recommended
            return None if rec is None else self.record(rec.trial)
        return fastest_feasible(self.records, self.search_loss)

    def sample_note(self) -> str:
        """How many examples stand behind each point: the evaluation's example count and the trial count."""
        runs = sorted({r.examples_run for r in self.complete})
        per = self.identity.n_examples
        return (
            f"n = {'/'.join(map(str, runs)) or '?'} validation examples per point "
            f"({'all' if per is None else per} per dataset of {self.identity.task}), "
            f"{len(self.complete)} complete trials"
        )

    def schedule_of(self, record: TrialRecord) -> Schedule:
        """``record``'s schedule with its provenance (and, for the recommendation, its confirmation)."""
        speed_kind = self.identity.speedup
        metrics: dict[str, Any] = {
            "speedup_kind": speed_kind,
            "flop_speedup": record.flop_speedup,
            "prompt_computed_pct": record.prompt_computed_pct,
            **{k: v for k, v in record.metrics.items() if k in ("score", "baseline_score", "top1", "kl")},
        }
        if record.complete:
            metrics |= {
                "speedup": record.values[0],
                "accuracy_loss": record.values[1],
                "accuracy_loss_unit": self.search_loss.unit,
            }
        meta: dict[str, Any] = {
            "source": "lazyllm-tuner",
            "study": self.study_name,
            "trial": record.number,
            "model": self.identity.model,
            "task": self.identity.task,
            "split": "validation",
            "search_space": self.identity.search_space,
            "metrics": metrics,
            "settings": {k: v for k, v in self.identity.to_dict().items() if k not in ("model", "task")},
            "lazyllm_version": lazyllm.__version__,
        }
        best = self.recommended
        if best is not None and record.number == best.number:
            meta["status"] = "provisional" if self.provisional else "confirmed"
            if self.confirmation is not None and self.confirmation.recommended is not None:
                meta["confirmation"] = self.confirmation.recommended.to_dict() | {
                    "level": self.confirmation.level,
                    "budget": self.confirmation.budget,
                    "n_examples": self.confirmation.n_examples,
                }
                cal = self.confirmation.calibration
                upper = self.confirmation.recommended_upper_at_confidence()
                if cal is not None and upper is not None:
                    # chosen on the bound at cal.level; is it certified at the study's confidence too?
                    meta["confirmation"] |= {
                        "decision_level": cal.level,
                        "calibration_exponent": cal.exponent,
                        "predicted_task_loss_upper": upper,
                        "certified_at_level": upper <= self.confirmation.budget,
                    }
                if cal is not None and cal.floor is not None:  # the slope prior it was checked against
                    meta["confirmation"]["slope_floor"] = cal.floor.to_dict()
                fresh = self.confirmation.fresh
                if fresh is not None:  # the fresh-drift check on prompts the search never saw
                    meta["confirmation"]["fresh"] = {
                        "prompts": fresh.prompts,
                        "n_examples": fresh.n_examples,
                        "kl": fresh.of(record.number),
                    }
            if self.decision:
                meta["decision"] = self.decision
        meta["budget"] = {"kind": self.budget_kind, "points": self.task_budget, "unit": self.points}
        meta["budget"]["text"] = self.budget_line()
        power = self.power if best is not None and record.number == best.number else None
        if power is not None:
            meta["budget"]["power"] = power
        if self.notes:
            meta["notes"] = list(self.notes)
        return Schedule.from_dict(record.schedule.to_dict() | {"metadata": meta})
