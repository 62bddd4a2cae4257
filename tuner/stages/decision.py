"""What bound the answer, as data: the budget, the search's cap, the data, or the time (the paragraph
that says it in words is :func:`tuner.report.decision.paragraph`).

* **budget**: a faster schedule of the front exists and its predicted (or measured) task loss is over
  the budget; the decision holds it and what it would have needed.
* **cap**: the next faster schedule of the front is outside the search's own cap (its loss bound over
  ``--max-kl``), so it was never a candidate; the decision holds its bound, the cap and, where the
  calibration has one, its predicted task loss.
* **data**: its point estimate is within budget but the evidence cannot certify it; the decision holds
  how many validation examples would (:meth:`tuner.statistics.calibration.Calibration.examples_to_certify`).
* **fresh check**: the next faster schedule passes at its validation KL but not the study's
  check on prompts the search never saw (:func:`tuner.stages.rule.pooled_rule`, step 5), which judges
  it at the larger of its two KLs with the slope's bound at ``--confidence``; the decision holds that
  KL and the prediction at it.
* **time**: the recommendation is the fastest schedule the study completed; the decision holds
  how many trials fit ``--trials-timeout`` at this model's measured cost per trial, and the
  ``--trials-timeout`` that would fit ``--n-trials``.

Whatever decided, a recommendation certified by the pooled calibration also gets a :class:`Certainty`
on its own: it was chosen on the bound at ``--decision-level``; it holds whether the bound
at ``--confidence`` is within the budget too, and if not, how many validation examples would make it
so (the power statement of :meth:`tuner.statistics.calibration.Calibration.examples_to_certify`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Literal

import optuna
from optuna.trial import TrialState

from tuner.evaluation.losses import Loss
from tuner.stages.confirm import FreshCheck
from tuner.stages.outcome import StudyOutcome
from tuner.statistics.calibration import Calibration
from tuner.study.records import TrialRecord
from tuner.study.workers import counts_towards_target


@dataclass(frozen=True)
class TrialTiming:
    """How long the study's trials took and how many the settings ask for."""

    finished: int
    n_trials: int
    median_s: float | None
    timeout_s: float | None

    @classmethod
    def of(cls, study: optuna.Study, n_trials: int, timeout_s: float | None) -> TrialTiming:
        durations = [  # the trials n_trials counts: a refused duplicate evaluated nothing
            t.duration.total_seconds()
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            if t.duration is not None and counts_towards_target(t)
        ]
        return cls(len(durations), n_trials, statistics.median(durations) if durations else None, timeout_s)

    def trials_fitting(self) -> int | None:
        """Trials that fit ``timeout_s`` at the median trial time (None without either)."""
        if self.median_s is None or self.timeout_s is None:
            return None
        return int(self.timeout_s // max(self.median_s, 1e-9))

    def timeout_needed(self) -> float | None:
        """The timeout (seconds) that would fit ``n_trials`` at the median trial time."""
        return None if self.median_s is None else self.n_trials * self.median_s


@dataclass(frozen=True)
class Certainty:
    """Whether a recommendation chosen on the bound at the decision level (``level``) is certified at
    ``confidence`` too: ``upper`` is its predicted task loss bound there (score points) from the
    calibration's slope bound ``slope_upper`` (in ``unit``: points per nat, or per nat^p for a concave
    calibration) on ``n_examples`` validation examples; ``examples_needed``: how many would certify it
    (None when certified, when no number would, or when no cost is measured)."""

    confidence: float
    level: float
    n_examples: int
    budget: float
    slope_upper: float
    upper: float
    examples_needed: int | None
    unit: str = "points per nat"

    @property
    def no_cost(self) -> bool:
        """Even the bound at ``confidence`` measures no task-score cost of KL."""
        return self.slope_upper <= 0

    @property
    def certified(self) -> bool:
        return not self.no_cost and self.upper <= self.budget


def certainty(
    kl: float, calibration: Calibration, budget: float, kl_upper: float | None = None
) -> Certainty | None:
    """The certainty at the study's ``confidence`` of a recommendation at mean KL ``kl`` (with
    ``kl_upper``, that KL's own one-sided bound where it was measured on fresh prompts) chosen by
    ``calibration`` (None when that level was not recorded, or for keep-all, ``kl <= 0``)."""
    upper = calibration.upper_with_kl_error(kl, kl_upper)
    slope_up = calibration.slope_upper_confidence
    if calibration.confidence is None or upper is None or slope_up is None or kl <= 0:
        return None
    need = None
    if slope_up > 0 and upper > budget:
        need = calibration.examples_to_certify(kl, budget, at_confidence=True)
    return Certainty(
        calibration.confidence,
        calibration.level,
        calibration.n_examples,
        budget,
        slope_up,
        upper,
        need,
        calibration.unit,
    )


def recommendation_certainty(outcome: StudyOutcome) -> Certainty | None:
    """:func:`certainty` of ``outcome``'s recommendation at its judged KL (the fresh prompts' where the
    fresh-drift check measured it); None without a calibrated recommendation, or for keep-all."""
    best, conf = outcome.recommended, outcome.confirmation
    if best is None or conf is None or conf.calibration is None:
        return None
    kl = best.values[1] if conf.fresh is None else conf.fresh.judged(best.number, best.values[1])
    up = None if conf.fresh is None else conf.fresh.judged_upper(best.number, best.values[1])
    return certainty(kl, conf.calibration, outcome.task_budget, up)


@dataclass(frozen=True)
class FrontStep:
    """A schedule of the front: its trial, speedup and search loss (with its one-sided bound)."""

    trial: int
    speedup: float
    loss: float
    loss_upper: float | None


@dataclass(frozen=True)
class Prediction:
    """The calibration's task loss of the next faster schedule (score points): its estimate and its
    one-sided bound at ``level``; ``no_cost``: the calibration measured no cost of KL (slope <= 0),
    so the estimate is no evidence of a gain."""

    estimate: float
    upper: float
    level: float
    no_cost: bool


Decided = Literal[
    "fastest completed",  # the search: the recommendation is the fastest schedule it completed
    "nothing completed",  # the data: no schedule to recommend
    "not task-scored",  # the data: no calibration to certify the next schedule with
    "over the cap",  # the search's cap: the next schedule was never a candidate
    "past the scored KL",  # the data: the next schedule is beyond what the calibration covers
    "over the budget",  # the budget: the next schedule is predicted over it
    "too few examples",  # the data: within budget as an estimate, not certified
    "refused by the fresh check",  # the data: certified at its validation KL, not at the fresh check's
]


@dataclass(frozen=True)
class Decision:
    """What bound the answer (see the module docstring), with the numbers that say so.

    Attributes:
        decided: which case. recommended / next_faster: the recommendation and the slowest front
        schedule faster than it (None where absent). search_loss: the search's loss (its unit, its
        cap). budget: the task-score budget (score points). timing: the trials' timing.
        certainty: of the recommendation at ``--confidence`` (None where not recorded).
        n_validation: the confirmation's validation examples (None without one).
        calibration: the pooled calibration (None without one). prediction: its prediction for
        ``next_faster``. examples_needed: validation examples that would certify ``next_faster``.
        fresh: the confirmation's fresh-drift check (None: not recorded).
    """

    decided: Decided
    recommended: FrontStep | None
    next_faster: FrontStep | None
    search_loss: Loss
    budget: float
    timing: TrialTiming
    certainty: Certainty | None = None
    n_validation: int | None = None
    calibration: Calibration | None = None
    prediction: Prediction | None = None
    examples_needed: int | None = None
    fresh: FreshCheck | None = None

    def fresh_kl(self, step: FrontStep | None) -> float | None:
        """``step``'s KL on the fresh prompts (None: not measured)."""
        return None if step is None or self.fresh is None else self.fresh.of(step.trial)


def _step(record: TrialRecord | None) -> FrontStep | None:
    if record is None:
        return None
    upper = None if record.loss is None else record.loss.upper
    return FrontStep(record.number, float(record.values[0]), float(record.values[1]), upper)


def decide(outcome: StudyOutcome, timing: TrialTiming) -> Decision:
    """What bound the answer of ``outcome`` (see the module docstring)."""
    best = outcome.recommended
    confirmation = outcome.confirmation
    calibration = None if confirmation is None else confirmation.calibration
    budget = outcome.task_budget
    faster = [r for r in outcome.judged_front if best is None or r.values[0] > best.values[0]]
    nxt = faster[-1] if faster else None  # the slowest of the faster ones: the next step up
    fresh = None if confirmation is None else confirmation.fresh

    def judged_kl(r: TrialRecord) -> float:
        """The KL the rule judged ``r`` at (its validation KL, or the fresh one where larger)."""
        return r.values[1] if fresh is None else fresh.judged(r.number, r.values[1])

    def judged_upper(r: TrialRecord) -> float | None:
        """That KL's one-sided bound where it is a fresh KL measured on every prompt (else None)."""
        return None if fresh is None else fresh.judged_upper(r.number, r.values[1])

    common = Decision(
        "nothing completed",
        recommended=_step(best),
        next_faster=_step(nxt),
        search_loss=outcome.search_loss,
        budget=budget,
        timing=timing,
        certainty=None
        if best is None or calibration is None
        else certainty(judged_kl(best), calibration, budget, judged_upper(best)),
        n_validation=None if confirmation is None else confirmation.n_examples,
        calibration=calibration,
        fresh=fresh,
    )
    if nxt is None:
        return replace(common, decided="fastest completed" if best is not None else "nothing completed")
    if calibration is None:
        return replace(common, decided="not task-scored")
    kl = judged_kl(nxt)
    est, up = calibration.predicted(kl)
    level = calibration.level
    need = calibration.examples_to_certify(kl, budget)
    checked = fresh is not None and fresh.of(nxt.number) is not None
    decided: Decided
    if nxt.loss is not None and not outcome.search_loss.within(nxt.loss):
        decided = "over the cap"
    elif not calibration.covers(nxt.values[1], nxt.number):
        decided = "past the scored KL"
    elif checked:  # measured only for a schedule that passed at its validation KL
        decided = "refused by the fresh check"
        conf = calibration.upper_at_confidence(kl)
        if conf is not None and calibration.confidence is not None and conf > up:
            up, level = conf, calibration.confidence  # what the check judged at
        need = calibration.examples_to_certify(kl, budget, at_confidence=level != calibration.level)
    elif need is None:
        decided = "over the budget"
    else:
        decided = "too few examples"
    prediction = Prediction(est, up, level, no_cost=calibration.slope <= 0)
    return replace(common, decided=decided, prediction=prediction, examples_needed=need)
