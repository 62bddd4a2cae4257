"""The fidelity cap of a search (from the model's calibration where one is known, else from a pilot
on the study's own model, else a constant), and its speed floor (:data:`MIN_SPEEDUP`).

A fidelity search caps the one-sided upper bound of each trial's mean KL per answer token (nats); the
cap is the constraint the study hands Optuna (``trial.set_constraint``), so a trial over it tells the
sampler where schedules cannot be picked. The user's budget is in task-score points; the packaged
slope prior of the model (:mod:`tuner.statistics.prior`: task-score points per nat, fitted on a large
recorded grid at the study's prompt length and calibration shape) converts it. Without a prior a
short pilot measures the slope on the study's own examples (:mod:`tuner.stages.pilot`, then
:func:`pilot_cap`); where that measures no cost of KL the cap is :data:`KL_PER_POINT` nats per point,
a constant from before the priors existed, the last resort; ``--max-kl`` overrides all of them. A
multi-fidelity search's short trials take ``search_max_kl`` where it is set (the long-prompt presets'
exploration cap), and only there: a search whose trials run at the target length reads its cap as
any other.
:class:`SearchCap` says which set it; the study's identity, its report and its MLflow parameters
carry that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.statistics.prior import SlopePrior

KL_PER_POINT = 0.3
"""Fidelity cap of a search where no calibration of the model is known, nats of mean KL per score
point of the user's budget. It is an exploration cap, not the decision: the study's own calibration
(:mod:`tuner.statistics.calibration`) picks the recommendation; ``benchmarks/decision_rule.py``
measures the rule with it (docs/statistics.md). Where a slope prior for the model is known the cap
follows it instead (:func:`search_cap`)."""

CAP_MARGIN = 1.5
"""A prior-derived search cap is the KL at which the prior predicts this many times the user's budget.
The cap binds the one-sided upper bound of a trial's KL (``--confidence``), which on a dozen examples
per dataset sits well above its estimate (docs/tuning.md#the-search-cap): the margin keeps a schedule
whose *estimate* is at the prior's budget KL feasible, and the sampler still learns that KL well past
it is out."""

MIN_SPEEDUP = 1.1
"""The search's speed floor (``--min-speedup``), the other edge of the region a search spends trials
in: a sampler's proposal the FLOP model puts below it is stopped before it runs and marked infeasible
(:meth:`tuner.stages.trial.TrialRunner.refuse_slow`). In README command 1's three seeds of
2026-12-05, 9 to 13 of each run's 46 to 49 proposals sat at 1.0-1.1x and held no pick; the picks ran
1.17-1.31x (docs/tuning.md#the-speed-floor). Queued schedules (the reference, the warm starts) are
never stopped by it."""

CAP_SOURCES = ("max_kl", "exploration", "prior", "pilot", "constant", "agreement")


@dataclass(frozen=True)
class SearchCap:
    """The fidelity cap of a search (nats of mean KL per answer token) and what set it.

    Attributes:
        nats: the cap.
        source: ``max_kl`` (the user's ``--max-kl``), ``exploration`` (``search_max_kl``: a
            multi-fidelity search's cap on its short trials, judged again at the target length),
            ``prior`` (the model's slope prior, with :data:`CAP_MARGIN`), ``pilot`` (a slope
            measured by a short pilot on the study's own model where no prior applies, with
            :data:`CAP_MARGIN`: :func:`pilot_cap`), ``constant`` (:data:`KL_PER_POINT` per point: no
            evidence) or ``agreement`` (an agreement budget: :data:`KL_PER_POINT` per gold point it
            corresponds to, :func:`agreement_cap`).
        prior: the prior's id when ``source`` is ``prior``.
    """

    nats: float
    source: str
    prior: str | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.nats) and self.nats >= 0):
            raise ValueError(f"search cap = {self.nats}: must be a finite number >= 0 (nats)")
        if self.source not in CAP_SOURCES:
            raise ValueError(f"search cap source = {self.source!r}: must be one of {', '.join(CAP_SOURCES)}")
        if (self.source == "prior") != (self.prior is not None):
            raise ValueError("a search cap names its prior exactly when the prior set it")

    def text(self) -> str:
        """The cap and what set it, for a report: ``"0.2083 nats (the slope prior ...)"``."""
        why = {
            "max_kl": "--max-kl",
            "exploration": (
                "search_max_kl: an exploration cap on the short trials of a multi-fidelity search; the "
                "front is judged again at the target length"
            ),
            "prior": f"the slope prior {self.prior}: the KL it predicts to lose {CAP_MARGIN:g}x the budget",
            "pilot": (
                "no prior for the model; a pilot of hand-made schedules on its own validation examples: "
                f"the KL at which their slope of task loss on KL predicts {CAP_MARGIN:g}x the budget"
            ),
            "constant": f"no calibration known for the model: {KL_PER_POINT:g} nats per point of budget",
            "agreement": (
                f"an agreement budget: {KL_PER_POINT:g} nats per gold point it corresponds to; no agreement "
                "calibration is packaged"
            ),
        }[self.source]
        return f"{self.nats:.4f} nats ({why})"


def search_cap(max_accuracy_loss: float, max_kl: float | None, prior: SlopePrior | None) -> SearchCap:
    """The fidelity cap of a search: ``max_kl`` when given; else the KL at which ``prior`` (the
    model's slope prior for the study's prompt length and calibration shape) predicts
    :data:`CAP_MARGIN` times the budget, ``(margin * B / slope)^(1/p)``; else :data:`KL_PER_POINT`
    per point. The prior's slope is read as measured on its own grid (no rescaling to the study's
    unpruned score, which is not known when the study is created); the decision floors its own
    calibration at the rescaled prior (:meth:`tuner.statistics.calibration.Calibration.floored`)."""
    if max_kl is not None:
        return SearchCap(max_kl, "max_kl")
    if prior is not None and prior.slope > 0 and max_accuracy_loss > 0:
        nats = (CAP_MARGIN * max_accuracy_loss / prior.slope) ** (1.0 / prior.exponent)
        return SearchCap(nats, "prior", prior.id)
    return SearchCap(KL_PER_POINT * max_accuracy_loss, "constant")


def pilot_cap(max_accuracy_loss: float, slope: float, exponent: float) -> SearchCap | None:
    """The search cap from a pilot's measured ``slope`` (points per nat^``exponent``, the pooled
    slope of task loss on ``KL^exponent`` of a few schedules scored on the study's own examples): the
    KL at which it predicts :data:`CAP_MARGIN` times the budget, as from a prior; None where the
    pilot measured no cost of KL (``slope <= 0``) or there is no budget, which leaves the constant."""
    if not (math.isfinite(slope) and slope > 0 and max_accuracy_loss > 0):
        return None
    return SearchCap((CAP_MARGIN * max_accuracy_loss / slope) ** (1.0 / exponent), "pilot")


def agreement_cap(gold_points: float) -> SearchCap:
    """The fidelity cap of a search budgeted in agreement points (a prompts file without answers) where
    no ``--max-kl`` is given: :data:`KL_PER_POINT` nats per gold point of the budget's gold equivalent
    (``gold_points``, from the agreement/gold line of ``benchmarks/agreement_vs_gold.py``). The packaged
    slope priors are in gold points at zero intercept, and agreement loss is not (it has a large
    intercept), so they do not convert it: the constant stays, and the report says so."""
    return SearchCap(KL_PER_POINT * gold_points, "agreement")
