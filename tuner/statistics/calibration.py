"""The user's budget in the search's units: how much task score a nat of KL costs, pooled over schedules.

The search measures fidelity (teacher-forced KL per answer token, nats) because it is cheap and
low-noise; the user's budget is in task-score points. One schedule's task-score loss on a dozen
examples cannot certify a 2-point budget (its one-sided bound sits several points above the estimate),
but the *relation* between the two signals can be estimated from every schedule that was scored on
the task at once, on the same examples, and then applied to any schedule's KL.

**Estimator.** For the scored schedules ``s = 1..S`` on the same ``n`` validation examples (macro
weights ``w_i``), with per-example KL ``k_si`` and task-score loss ``t_si`` (points):

* schedule means ``K_s = sum_i w_i k_si / sum_i w_i`` and ``T_s`` alike;
* the pooled ratio through the origin ``b = sum_s T_s / sum_s K_s`` (points per nat). Through the
  origin because a schedule with zero KL reproduces the unpruned model's answers exactly (loss 0);
  pooled as a ratio of sums so that schedules with more drift, which say more about the slope,
  weigh more;
* its uncertainty by the bootstrap over **examples**: each resample draws ``n`` examples with
  replacement and recomputes ``b`` from all schedules on those examples, so the correlation between
  schedules on the same example is kept (a cluster bootstrap with examples as clusters);
* the one-sided upper bound ``b_up`` is the ``level`` quantile of the resampled slopes.

**The constraint.** A schedule whose mean KL is ``K`` is predicted to lose at most ``b_up * K``
points with confidence ``level``; the largest KL within a budget ``B`` is ``B / b_up``, but never
more than the largest KL among the scored schedules: the linear relation is not extrapolated past
the evidence. When the slope is not positive on the evidence (pruning never cost task score on these
examples) the bound is that largest scored KL.

**Two levels.** The bound that decides the recommendation is taken at the study's ``decision_level``
(``benchmarks/decision_rule.py`` measures that rule's error rates); the same bootstrap also gives the
slope's bound at the study's ``confidence``, so the report says whether the recommendation is
certified at that level too (``b_up(confidence) * K`` within ``B``), not only chosen at the lower one.

**Floor.** Given a :class:`~tuner.statistics.prior.SlopePrior` for the model and a study with fewer
validation examples than its power curve asks for the budget, :meth:`Calibration.floored` raises
the slope and both bounds to at least the prior's (see :mod:`tuner.statistics.prior`); the
:class:`Floor` it records says what the study's own fit was and whether the floor changed anything.

**Scale.** A prior that scales by the unpruned score is read at the study's own, measured on the
calibration's few examples: an estimate like the slope, which a bound read at the point leaves out
(the 4096-token studies whose validation scores fell in the test split's low tail lost more than
their certified bounds on test, benchmarks/prediction_check.py). Given the score's per-example
values (:class:`UnprunedScore`), the bound at ``confidence`` (what "certified" means) is read at the
score's own one-sided bound at that level, and so, with ``decide_at_bound`` (a study's default,
``--prior-at-score-bound``), is the bound that decides: ``benchmarks/decision_rule.py --score-levels``
replays it against reading the score as exact (docs/statistics.md has what it changes, and where
the fresh-drift check had already carried the score's error into the decision). The slope, the
point prediction, stays at the score.

**Shape.** ``exponent = p`` bends the relation to ``T = b * K^p`` (``0 < p <= 1``; the ratio becomes
``b = sum_s T_s / sum_s K_s^p``, points per nat^p, and the largest KL within ``B`` is ``(B / b_up)^(1/p)``).
``p = 1`` is the straight line above. The recorded grids measure a concave cost: a tiny KL already
flips greedy answers where two tokens are nearly tied, and the straight line anchored by the
fastest scored schedule under-predicts the slow ones (``p = 0.5`` fits both grids best,
docs/statistics.md); ``benchmarks/decision_rule.py --exponent`` replays the rule with it.

**Power.** When a schedule's point prediction ``b * K`` is within budget but its bound is not, the
data cannot certify it; with the standard error shrinking as ``1/sqrt(n)``, about
``n * ((b_up - b) * K / (B - b * K))^2`` examples would (``b * K`` taken as 0 when it is negative:
a predicted gain is no evidence of one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tuner.statistics.bootstrap import DEFAULT_N_BOOT, DEFAULT_SEED, check_level, estimate
from tuner.statistics.shape import LINEAR, check_exponent, slope_unit

if TYPE_CHECKING:
    from tuner.statistics.prior import SlopePrior


@dataclass(frozen=True)
class ScoredSchedule:
    """One schedule's per-example evidence on both signals.

    Attributes:
        trial: the trial that evaluated it.
        kl: per-example mean KL per answer token (nats), by example key.
        task_loss: per-example task-score loss (points), by example key.
    """

    trial: int
    kl: Mapping[str, float]
    task_loss: Mapping[str, float]

    def __post_init__(self) -> None:
        if set(self.kl) != set(self.task_loss):
            raise ValueError(f"trial {self.trial}: KL and task loss cover different examples")


@dataclass(frozen=True)
class UnprunedScore:
    """The study's unpruned score (points, macro over datasets) on the calibration's examples, with
    its one-sided bootstrap upper bound: what a prior that scales by the score is read at.

    Attributes:
        value: the score.
        n: examples it was measured on.
        upper: its one-sided bound at ``level`` (the calibration's ``confidence``).
        level: that bound's level.
    """

    value: float
    n: int
    upper: float
    level: float

    @classmethod
    def measured(
        cls,
        scores: Sequence[float],
        weights: Sequence[float],
        *,
        level: float,
        value: float | None = None,
        n_boot: int = DEFAULT_N_BOOT,
        seed: int = DEFAULT_SEED,
    ) -> UnprunedScore:
        """From the unpruned model's per-example scores (points) and their macro ``weights``, the bound
        at ``level``; ``value`` is the score as the report gives it (None: their weighted mean). The
        bound is never below it."""
        est = estimate(scores, weights, level=level, n_boot=n_boot, seed=seed)
        score = est.value if value is None else value
        return cls(score, len(scores), max(est.upper, score), level)


@dataclass(frozen=True)
class Floor:
    """The slope prior a calibration was checked against, and what the study's own fit said.

    Attributes:
        prior: the prior's id (:attr:`SlopePrior.id`).
        prior_n_examples: the examples the prior was fitted on.
        prior_slope, prior_upper, prior_upper_confidence: the prior's slope and its bounds at the
            calibration's ``level`` and ``confidence``.
        own_slope, own_upper, own_upper_confidence: the study's own fit.
        examples_needed: validation examples the power curve asks for at the study's budget (None: no
            curve recorded, or none of its ``n`` reached the target).
        applied: whether the floor applies: the study was underpowered, or its own fit measured no
            cost (its bound at ``level`` <= 0), which the prior's examples contradict.
        target_rate: the power curve's target rate of picks over budget on test.
        scale: the factor the prior's slope was read at (1 for an ``absolute`` prior; the study's
            unpruned score over the grid's for ``baseline``); ``prior_*`` are after it.
        baseline_score: the study's unpruned score (points) it was scaled to (None: not scaled).
        baseline_upper_confidence: that score's one-sided bound at ``confidence``, what
            ``prior_upper_confidence`` was read at (None: the score was taken as exact, or not scaled).
        decided_at_bound: whether ``prior_upper``, the bound that decides, was read at that bound
            too (False: at the score).
        largest_replayed: the largest ``n`` the power curve replayed at the budget (None: no curve
            for it); with ``examples_needed`` None, no ``n`` up to it kept the target rate.
    """

    prior: str
    prior_n_examples: int
    prior_slope: float
    prior_upper: float
    prior_upper_confidence: float | None
    own_slope: float
    own_upper: float
    own_upper_confidence: float | None
    examples_needed: int | None
    applied: bool
    target_rate: float = 0.10
    scale: float = 1.0
    baseline_score: float | None = None
    largest_replayed: int | None = None
    baseline_upper_confidence: float | None = None
    decided_at_bound: bool = False

    @property
    def binds(self) -> bool:
        """The floor changed the decision's bound (the prior's is above the study's own)."""
        return self.applied and self.prior_upper > self.own_upper

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Floor:
        def opt(key: str) -> float | None:
            return None if data.get(key) is None else float(data[key])

        need = data.get("examples_needed")
        largest = data.get("largest_replayed")
        return cls(
            prior=str(data["prior"]),
            prior_n_examples=int(data["prior_n_examples"]),
            prior_slope=float(data["prior_slope"]),
            prior_upper=float(data["prior_upper"]),
            prior_upper_confidence=opt("prior_upper_confidence"),
            own_slope=float(data["own_slope"]),
            own_upper=float(data["own_upper"]),
            own_upper_confidence=opt("own_upper_confidence"),
            examples_needed=None if need is None else int(need),
            applied=bool(data["applied"]),
            target_rate=float(data.get("target_rate", 0.10)),
            scale=float(data.get("scale", 1.0)),
            baseline_score=opt("baseline_score"),
            largest_replayed=None if largest is None else int(largest),
            baseline_upper_confidence=opt("baseline_upper_confidence"),
            decided_at_bound=bool(data.get("decided_at_bound", False)),
        )


@dataclass(frozen=True)
class Calibration:
    """Task-score points per nat of KL, with its one-sided upper bound (see the module docstring).

    Attributes:
        slope: pooled points per nat.
        slope_upper: its one-sided upper bound at ``level``.
        level: confidence level.
        n_examples: examples every scored schedule shares.
        trials: the scored schedules' trial numbers.
        max_scored_kl: the largest mean KL among them (nats).
        points: per scored schedule, ``(trial, mean KL, mean task loss)``.
        confidence: the study's ``--confidence``, a second level reported beside ``level`` (None in
            calibrations stored before it was recorded).
        slope_upper_confidence: the slope's one-sided upper bound at ``confidence``.
        floor: the slope prior it was checked against (None: none); when applied, ``slope`` and both
            bounds are the larger of the study's own and the prior's.
        exponent: the shape ``p`` of ``loss = slope * KL^p`` (1: a straight line; the slopes are in
            points per nat^p).
    """

    slope: float
    slope_upper: float
    level: float
    n_examples: int
    trials: tuple[int, ...]
    max_scored_kl: float
    points: tuple[tuple[int, float, float], ...]
    confidence: float | None = None
    slope_upper_confidence: float | None = None
    floor: Floor | None = None
    exponent: float = LINEAR

    def __post_init__(self) -> None:
        check_exponent(self.exponent)
        check_level(self.level)
        if (self.confidence is None) != (self.slope_upper_confidence is None):
            raise ValueError("confidence and slope_upper_confidence: give both or neither")
        if self.confidence is not None:
            check_level(self.confidence)

    def floored(
        self,
        prior: SlopePrior,
        budget: float,
        baseline_score: float | UnprunedScore | None = None,
        *,
        decide_at_bound: bool = False,
    ) -> Calibration:
        """This calibration checked against ``prior`` at ``budget`` (points): when its examples are
        fewer than the prior's power curve asks for (or the curve is not recorded), or when it measures
        no cost of KL at all, the slope and its bounds become at least the prior's, read at the study's
        unpruned ``baseline_score`` (points) for a prior that scales by it: a number is taken as exact;
        with an :class:`UnprunedScore` the bound at ``confidence`` is read at the score's bound, which
        must be at that level, and with ``decide_at_bound`` the bound at ``level`` (the one that
        decides) too (see the module docstring)."""
        if prior.exponent != self.exponent:
            raise ValueError(
                f"slope prior {prior.id} was fitted at exponent {prior.exponent:g}, the calibration at "
                f"{self.exponent:g}: give a prior fitted at the same exponent (benchmarks/slope_prior.py --exponent)"
            )
        need = prior.examples_needed(budget)
        # "no cost seen" is not "no cost": the prior measured one, on more examples than any study here
        applied = need is None or self.n_examples < need or self.slope_upper <= 0
        point: float | None = None
        bound: float | None = None  # the score's bound at ``confidence``, for a prior that scales by it
        if isinstance(baseline_score, UnprunedScore):
            point = baseline_score.value
            if self.confidence is not None and prior.scaling != "absolute":
                if not math.isclose(baseline_score.level, self.confidence):
                    raise ValueError(
                        f"the unpruned score's bound is at level {baseline_score.level:g}, the calibration's "
                        f"confidence at {self.confidence:g}: measure the score's bound at the confidence"
                    )
                bound = baseline_score.upper
        else:
            point = baseline_score
        scale = prior.scale(point)
        scale_conf = scale if bound is None else prior.scale(bound)
        at_conf = None if self.confidence is None else scale_conf * prior.upper(self.confidence)
        at_bound = decide_at_bound and bound is not None
        floor = Floor(
            prior=prior.id,
            prior_n_examples=prior.n_examples,
            prior_slope=scale * prior.slope,
            prior_upper=(scale_conf if at_bound else scale) * prior.upper(self.level),
            prior_upper_confidence=at_conf,
            own_slope=self.slope,
            own_upper=self.slope_upper,
            own_upper_confidence=self.slope_upper_confidence,
            examples_needed=need,
            applied=applied,
            target_rate=prior.target_rate,
            scale=scale,
            baseline_score=None if prior.scaling == "absolute" else point,
            largest_replayed=prior.largest_replayed(budget),
            baseline_upper_confidence=bound,
            decided_at_bound=at_bound,
        )
        if not applied:
            return replace(self, floor=floor)
        upper_conf = self.slope_upper_confidence
        return replace(
            self,
            slope=max(self.slope, floor.prior_slope),
            slope_upper=max(self.slope_upper, floor.prior_upper),
            slope_upper_confidence=None
            if upper_conf is None or at_conf is None
            else max(upper_conf, at_conf),
            floor=floor,
        )

    def floor_text(self) -> str:
        """One clause on the floor when it changed the bound (empty otherwise)."""
        f = self.floor
        if f is None or not f.binds:
            return ""
        return (
            f"; slope floored at the open-QA prior's {f.prior_slope:.1f} (bound {f.prior_upper:.1f}) {self.unit}, "
            f"over the study's own {f.own_slope:.1f} (bound {f.own_upper:.1f})"
        )

    @property
    def unit(self) -> str:
        """The slopes' unit: ``points per nat`` (or ``per nat^p`` for a concave calibration)."""
        return slope_unit(self.exponent)

    def shape(self, kl: float) -> float:
        """``kl^p``: what the slopes multiply (0 for ``kl <= 0``)."""
        return float(kl) ** self.exponent if kl > 0 else 0.0

    def max_kl(self, budget: float) -> float:
        """The largest mean KL (nats) whose predicted task loss bound is within ``budget`` points."""
        if self.slope_upper <= 0:
            return self.max_scored_kl
        return min((budget / self.slope_upper) ** (1.0 / self.exponent), self.max_scored_kl)

    def covers(self, kl: float, trial: int | None = None) -> bool:
        """Whether ``kl`` is within the scored evidence (no farther than the largest scored KL), or
        ``trial`` is one of the scored schedules: its own task score is evidence whatever its KL on
        other examples (the search's mean KL of a schedule scored on more examples differs from its
        calibration KL by sampling alone).

        The comparison forgives float rounding: a scored trial's own mean KL, summed in another
        order than the calibration's, may come out a few ulps above it, and must not be refused for that."""
        return trial in self.trials or kl <= self.max_scored_kl * (1.0 + 1e-9) + 1e-15

    def predicted(self, kl: float) -> tuple[float, float]:
        """``(estimate, upper bound)`` of the task loss (points) of a schedule with mean KL ``kl``."""
        x = self.shape(kl)
        return self.slope * x, self.slope_upper * x

    def no_cost_text(self) -> str:
        """What a calibration with no measured cost (``slope <= 0``) certifies, in words: its negative
        predicted losses are no evidence of a gain, only of nothing lost up to the largest scored KL."""
        return (
            f"the calibration measured no task-score cost of KL on these examples (slope {self.slope:.1f} "
            f"{self.unit}), so it certifies nothing past the largest scored KL ({self.max_scored_kl:.4f} nats)"
        )

    def upper_at_confidence(self, kl: float) -> float | None:
        """The task-loss bound (points) of a schedule with mean KL ``kl`` at ``confidence`` (None when
        not recorded); a negative bound is reported as 0, since it is no evidence of a gain."""
        if self.slope_upper_confidence is None:
            return None
        return max(self.slope_upper_confidence * self.shape(kl), 0.0)

    def upper_with_kl_error(self, kl: float, kl_upper: float | None) -> float | None:
        """The task-loss bound (points) at ``confidence`` of a schedule whose mean KL ``kl`` is itself a
        sample's mean, with ``kl_upper`` its one-sided bound at ``confidence`` (None: ``kl`` taken as
        exact, :meth:`upper_at_confidence`); None when that level was not recorded.

        Two independent errors (the slope's, from the calibration's examples; the KL's, from other
        prompts) add in quadrature around the estimate ``b * K^p`` (a negative one taken as 0):
        ``est + sqrt((b_up K^p - est)^2 + (b (kl_upper^p - K^p))^2)``, never below
        :meth:`upper_at_confidence` and non-decreasing in both KLs. With ``b <= 0`` the KL's error
        moves no prediction, and the slope's bound alone stays."""
        bound = self.upper_at_confidence(kl)
        if bound is None or kl_upper is None:
            return bound
        if kl_upper < kl:
            raise ValueError(f"KL bound {kl_upper} below its mean {kl}: give the one-sided upper bound")
        est = max(self.slope * self.shape(kl), 0.0)
        from_kl = max(self.slope, 0.0) * (self.shape(kl_upper) - self.shape(kl))
        return est + math.hypot(bound - est, from_kl)

    def examples_to_certify(self, kl: float, budget: float, *, at_confidence: bool = False) -> int | None:
        """How many examples would certify a schedule at ``kl`` (None: its estimate is over budget), at
        ``level``, or at ``confidence`` with ``at_confidence`` (None too when that was not recorded)."""
        estimate, upper = self.predicted(kl)
        if at_confidence:
            bound = self.upper_at_confidence(kl)
            if bound is None:
                return None
            upper = bound
        estimate = max(estimate, 0.0)  # a predicted gain is no evidence of one
        if estimate >= budget:
            return None
        if upper <= budget:
            return self.n_examples
        return math.ceil(self.n_examples * ((upper - estimate) / (budget - estimate)) ** 2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "slope_points_per_nat": self.slope,
            "slope_upper": self.slope_upper,
            "level": self.level,
            "n_examples": self.n_examples,
            "trials": list(self.trials),
            "max_scored_kl": self.max_scored_kl,
            "points": [list(p) for p in self.points],
            "confidence": self.confidence,
            "slope_upper_confidence": self.slope_upper_confidence,
            "floor": None if self.floor is None else self.floor.to_dict(),
            "exponent": self.exponent,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        return cls(
            slope=float(data["slope_points_per_nat"]),
            slope_upper=float(data["slope_upper"]),
            level=float(data["level"]),
            n_examples=int(data["n_examples"]),
            trials=tuple(int(t) for t in data["trials"]),
            max_scored_kl=float(data["max_scored_kl"]),
            points=tuple((int(p[0]), float(p[1]), float(p[2])) for p in data["points"]),
            confidence=None if data.get("confidence") is None else float(data["confidence"]),
            slope_upper_confidence=(
                None if data.get("slope_upper_confidence") is None else float(data["slope_upper_confidence"])
            ),
            floor=None if data.get("floor") is None else Floor.from_dict(data["floor"]),
            exponent=float(data.get("exponent", LINEAR)),
        )


def pooled_slope(kl_means: np.ndarray, tl_means: np.ndarray, exponent: float = LINEAR) -> float:
    """The pooled ratio through the origin ``sum_s T_s / sum_s K_s^p`` of the schedules' means (a
    mean KL is >= 0 but for rounding)."""
    return float(tl_means.sum() / (np.clip(kl_means, 0.0, None) ** exponent).sum())


def bootstrap_slopes(
    scored: Sequence[ScoredSchedule],
    weights: Mapping[str, float],
    *,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
    exponent: float = LINEAR,
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray] | None:
    """The shared examples, the per-schedule mean KL and task loss ``[S]``, and ``n_boot`` resampled
    pooled slopes ``[B]`` at ``exponent`` (the cluster bootstrap over examples of the module
    docstring); None when no schedule drifted at all."""
    check_exponent(exponent)
    if not scored:
        return None
    keys = sorted(set.intersection(*(set(s.kl) for s in scored)))
    if not keys:
        raise ValueError("the scored schedules share no example")
    w = np.array([weights[k] for k in keys], dtype=np.float64)  # [n]
    kl = np.array([[s.kl[k] for k in keys] for s in scored], dtype=np.float64)  # [S, n]
    tl = np.array([[s.task_loss[k] for k in keys] for s in scored], dtype=np.float64)  # [S, n]
    kl_means, tl_means = kl @ w / w.sum(), tl @ w / w.sum()  # [S]
    if kl_means.sum() <= 0:
        return None
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(keys), size=(n_boot, len(keys)))  # [B, n]
    wb = w[idx]  # [B, n]
    k_b = (kl[:, idx] * wb).sum(axis=2) / wb.sum(axis=1)  # [S, B]
    t_b = (tl[:, idx] * wb).sum(axis=2) / wb.sum(axis=1)
    denom = (np.clip(k_b, 0.0, None) ** exponent).sum(axis=0)  # a mean KL is >= 0 but for rounding
    slopes = np.where(denom > 0, t_b.sum(axis=0) / np.where(denom > 0, denom, 1.0), 0.0)
    return keys, kl_means, tl_means, slopes


def fit(
    scored: Sequence[ScoredSchedule],
    weights: Mapping[str, float],
    *,
    level: float,
    confidence: float | None = None,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
    exponent: float = LINEAR,
) -> Calibration | None:
    """The pooled slope of ``scored`` with its bound at ``level`` and, given ``confidence``, at that
    level too, from the same bootstrap, for the shape ``loss = slope * KL^exponent`` (None when no
    scored schedule drifted at all)."""
    check_level(level)
    if confidence is not None:
        check_level(confidence)
    boot = bootstrap_slopes(scored, weights, n_boot=n_boot, seed=seed, exponent=exponent)
    if boot is None:
        return None
    keys, kl_means, tl_means, slopes = boot
    return Calibration(
        slope=pooled_slope(kl_means, tl_means, exponent),
        slope_upper=float(np.quantile(slopes, level)),
        level=level,
        n_examples=len(keys),
        trials=tuple(s.trial for s in scored),
        max_scored_kl=float(kl_means.max()),
        points=tuple((s.trial, float(k), float(t)) for s, k, t in zip(scored, kl_means, tl_means)),
        confidence=confidence,
        slope_upper_confidence=None if confidence is None else float(np.quantile(slopes, confidence)),
        exponent=exponent,
    )
