"""What bound the answer, in one paragraph: the budget, the search's cap, the data, or the time.

* **budget**: a faster schedule of the front exists and its predicted (or measured) task loss is over
  the budget; the paragraph names it and what it would have needed.
* **cap**: the next faster schedule of the front is outside the search's own cap (its loss bound over
  ``--max-kl``), so it was never a candidate; the paragraph gives its bound, the cap and, where the
  calibration has one, its predicted task loss.
* **data**: its point estimate is within budget but the evidence cannot certify it; the paragraph says
  how many validation examples would (:meth:`tuner.statistics.calibration.Calibration.examples_to_certify`).
* **time**: the recommendation is the fastest schedule the study completed; the paragraph says how
  many trials fit the timeout at this model's measured cost per trial, and the ``--timeout`` that would
  fit ``--n-trials``.

Whatever decided, a recommendation certified by the pooled calibration also gets one sentence on its
own certainty: it was chosen on the bound at ``--decision-level``; the sentence says whether the bound
at ``--confidence`` is within the budget too, and if not, how many validation examples would make it
so (the power statement of :meth:`tuner.statistics.calibration.Calibration.examples_to_certify`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from tuner.statistics.calibration import Calibration
from tuner.study.outcome import StudyOutcome


@dataclass(frozen=True)
class TrialTiming:
    """How long the study's trials took and how many the settings ask for."""

    finished: int
    n_trials: int
    median_s: float | None
    timeout_s: float | None

    @classmethod
    def of(cls, study: optuna.Study, n_trials: int, timeout_s: float | None) -> TrialTiming:
        durations = [
            t.duration.total_seconds()
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            if t.duration is not None
        ]
        return cls(len(durations), n_trials, statistics.median(durations) if durations else None, timeout_s)

    def sentence(self) -> str:
        """``"At 41 s per trial (median of 9), --timeout 660 fits about 16 trials; --n-trials 40 needs
        about --timeout 1640."``"""
        if self.median_s is None:
            return "No trial finished yet."
        per = self.median_s
        text = f"At {per:.0f} s per trial (median of {self.finished})"
        if self.timeout_s is not None:
            text += (
                f", --timeout {self.timeout_s:g} fits about {int(self.timeout_s // max(per, 1e-9))} trials"
            )
        return f"{text}; --n-trials {self.n_trials} needs about --timeout {self.n_trials * per:.0f}."


def certainty(kl: float, calibration: Calibration, budget: float) -> str:
    """One sentence on a recommendation at mean KL ``kl`` chosen by ``calibration``: is it certified at
    the study's ``confidence`` as well as at the decision level (empty when that was not recorded)?"""
    upper = calibration.upper_at_confidence(kl)
    slope_up = calibration.slope_upper_confidence
    if calibration.confidence is None or upper is None or slope_up is None or kl <= 0:
        return ""
    at = f"--confidence {calibration.confidence:.0%}"
    if slope_up <= 0:  # "at most 0 points" would claim more than n examples with no visible cost can
        return (
            f"At {at} the calibration still measures no task-score cost of KL (slope bound {slope_up:.1f} points "
            f"per nat): the {calibration.n_examples} validation examples show none, and a cost that they do not "
            f"show is not bounded by them. "
        )
    if upper <= budget:
        return (
            f"At {at} the recommendation is certified too: its predicted task loss is at most {upper:.2f} "
            f"score points (n={calibration.n_examples}). "
        )
    need = calibration.examples_to_certify(kl, budget, at_confidence=True)
    more = (
        f"about {need} validation examples (now {calibration.n_examples}) would certify it"
        if need is not None
        else "no number of examples would, as its predicted loss is over the budget"
    )
    return (
        f"The recommendation is within the {budget:g}-point budget at the decision level ({calibration.level:.0%}, "
        f"--decision-level) but not certified at {at}: its predicted task loss could reach {upper:.2f} score "
        f"points; {more}. "
    )


def explain(outcome: StudyOutcome, timing: TrialTiming) -> str:
    """The paragraph (see the module docstring)."""
    front = outcome.front
    best = outcome.recommended
    confirmation = outcome.confirmation
    calibration = None if confirmation is None else confirmation.calibration
    budget = outcome.task_budget
    faster = [r for r in front if best is None or r.values[0] > best.values[0]]
    nxt = faster[-1] if faster else None  # the slowest of the faster ones: the next step up
    own = "" if best is None or calibration is None else certainty(best.values[1], calibration, budget)
    done = f"{own}{timing.finished} of {timing.n_trials} trials finished. {timing.sentence()}"
    if best is not None and nxt is None:
        return (
            f"What decided: the search. The recommendation (trial {best.number}, {best.values[0]:.2f}x) is the "
            f"fastest schedule the study completed within budget; more trials may find faster ones. {done}"
        )
    if nxt is None:
        return f"What decided: the data. The study completed no schedule to recommend. {done}"
    where = f"trial {nxt.number} ({nxt.values[0]:.2f}x, {outcome.search_loss.text(nxt.values[1])})"
    head = (
        "nothing is recommended"
        if best is None
        else f"the recommendation is trial {best.number} ({best.values[0]:.2f}x)"
    )
    if calibration is None:
        n = "?" if confirmation is None else str(confirmation.n_examples)
        return (
            f"What decided: the data. {head.capitalize()}; the next faster schedule, {where}, could not be "
            f"certified on the task score directly (n={n}). "
            f"{done}"
        )
    est, up = calibration.predicted(nxt.values[1])
    need = calibration.examples_to_certify(nxt.values[1], budget)
    prediction = (
        calibration.no_cost_text()  # a negative "loss" would be read as a gain
        if calibration.slope <= 0
        else f"predicted to lose {est:.2f} score points (upper bound {up:.2f}, {calibration.level:.0%})"
    )
    cap = outcome.search_loss
    if nxt.loss is not None and not cap.within(nxt.loss):
        return (
            f"What decided: the search's cap. {head.capitalize()}; the next faster schedule, {where}, has a "
            f"loss bound of {cap.text(nxt.loss.upper)}, over the search's cap of {cap.text(cap.budget)} "
            f"(--max-kl), so it was not a candidate ({prediction}). {done}"
        )
    if not calibration.covers(nxt.values[1]):
        return (
            f"What decided: the data. {head.capitalize()}; the next faster schedule, {where}, drifts past the "
            f"largest KL scored on the task ({calibration.max_scored_kl:.4f} nats), where the calibration is not "
            f"extrapolated ({prediction}). {done}"
        )
    if need is None:
        return (
            f"What decided: the budget. {head.capitalize()}; the next faster schedule, {where}, is {prediction}, "
            f"over the {budget:g}-point budget even as an estimate. {done}"
        )
    return (
        f"What decided: the data. {head.capitalize()}; the next faster schedule, {where}, is {prediction}: within "
        f"the {budget:g}-point budget as an estimate but not certified; about {need} validation examples "
        f"(now {calibration.n_examples}) would certify it. {done}"
    )
