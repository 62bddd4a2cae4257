"""The decision rule of a fidelity study, as one pure function: feasible front -> the schedules to
task-score -> the pooled calibration -> the pick.

:func:`pooled_rule` is what the study runs (:func:`tuner.stages.confirm.confirm_pooled` gives it the
study's records and a scorer that runs the task on the validation examples) and what
``benchmarks/decision_rule.py`` replays (with a scorer that looks up recorded task losses on a
resample of the examples), so a change to the rule is measured by the benchmark. It writes nothing
and reads nothing but its arguments.

1. **Front**: the feasible Pareto front of ``records`` under the search's loss (its cap on the one-sided
   bound of mean KL), fastest first (:func:`tuner.stages.front.feasible_front`).
2. **Scored**: up to ``k`` front schedules that drift (KL > 0), spread evenly over the front with the
   fastest included (:func:`spread`), are task-scored by ``evidence`` (on the search's examples or
   on more of them: ``--confirm-n-examples``).
3. **Calibration**: the pooled slope of task loss on ``KL^exponent`` through the origin (``exponent``
   1: a straight line), with its one-sided bound at
   ``level`` (the decision level) and at ``confidence`` (reported) (:func:`tuner.statistics.calibration.fit`);
   given the model's slope ``prior`` and fewer examples than its power curve asks for the budget,
   the slope and bounds are floored at the prior's (:meth:`Calibration.floored`).
4. **Pick**: the fastest front schedule with no drift, or whose predicted task-loss bound at ``level``
   is within the budget and whose KL is within the scored evidence or which was itself task-scored
   (:meth:`Calibration.covers`).
5. **Fresh drift** (given ``fresh``): a schedule that passes 4 is also judged at its KL on prompts the
   search never saw (``fresh``, called fastest first until one passes), the larger of the two KLs,
   and there at the slope's bound at ``confidence`` (the user's level), not at ``level``; where the
   fresh KL is the larger, its own sampling error (its one-sided bound over the prompts, when the
   measurer gives one) adds to the slope's in quadrature
   (:meth:`~tuner.statistics.calibration.Calibration.upper_with_kl_error`): a mean over a few dozen
   prompts, where a handful drift most, is an estimate too. A
   search that ranks about 50 schedules on a few examples, which its calibration then reads them at,
   keeps the lucky draws: its front's validation KLs understate their drift. A KL measured elsewhere
   carries no such selection, but its prompts are not the user's: the lower decision level is what
   the power curve measured on a fixed grid, and that replay has neither the selection nor the shift
   between prompt sets, so this step keeps the stated confidence. The slope is read at the KL as
   measured (coverage stays the validation KL's: the prior's floor, fitted on open-QA KLs up to about
   2 nats, is what extends it). The caller
   decides when it is worth it (:func:`tuner.stages.confirm.confirm_pooled`: when the search's
   examples are fewer than the check's prompts); the replay of a fixed grid cannot measure that
   selection, so the power curve does not gate it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tuner.evaluation.losses import Loss, ScoreLoss
from tuner.stages.front import feasible_front
from tuner.statistics.bootstrap import DEFAULT_N_BOOT, DEFAULT_SEED, estimate
from tuner.statistics.calibration import Calibration, ScoredSchedule, UnprunedScore, fit
from tuner.statistics.prior import SlopePrior
from tuner.statistics.shape import LINEAR
from tuner.study.records import TrialRecord

T = TypeVar("T")

Evidence = Callable[[Sequence[TrialRecord]], Sequence[ScoredSchedule]]
"""The records the rule chose to score -> their scored evidence, in the same order: per-example KL
(nats) and task-score loss (points) on the calibration's examples (the search's own, whose KLs the
records hold, or a larger set). All at once, so a scorer may go example by example."""

Refused = Callable[[float], bool]
"""A fresh KL (nats) -> whether step 5 of :func:`pooled_rule` refuses the record at it, read as exact
(its sampling error only adds to the bound, so it is refused then at any error too). Non-decreasing
in the KL: once a KL is refused, every larger one is too."""


@dataclass(frozen=True)
class FreshKL:
    """What a :data:`FreshDrift` measured: a record's mean KL (nats per answer token) on prompts the
    search never saw, or, with ``complete`` False, a lower bound of it that the rule refuses (the
    measurer stopped there: the prompts measured so far, counted over all of them with the rest at 0).
    ``upper``: the mean's one-sided bound at the rule's ``confidence``, resampling the prompts (None:
    not measured, or not complete; the rule then reads ``kl`` as exact)."""

    kl: float
    complete: bool = True
    upper: float | None = None

    def __post_init__(self) -> None:
        if not self.kl >= 0:
            raise ValueError(f"fresh KL = {self.kl}: must be >= 0")
        if self.upper is not None and (not self.complete or not self.upper >= self.kl):
            raise ValueError(
                f"fresh KL bound = {self.upper}: a complete check's bound, at least its mean {self.kl}"
            )


def measured_fresh_kl(
    kls: Sequence[float], weights: Sequence[float], datasets: Sequence[str], confidence: float
) -> FreshKL:
    """The :class:`FreshKL` of a check that read every prompt: the weighted mean of the per-prompt
    ``kls`` and its one-sided bound at ``confidence``, the prompts resampled within each dataset."""
    spread = estimate(kls, weights, strata=datasets, level=confidence)  # its value is the weighted mean
    return FreshKL(spread.value, upper=max(spread.upper, spread.value))


FreshDrift = Callable[[TrialRecord, Refused], FreshKL]
"""A front record and the rule's :data:`Refused` for it -> its :class:`FreshKL` on prompts the search
never saw (teacher-forced against the unpruned answer: no gold answer needed), what step 5 of
:func:`pooled_rule` reads. KLs are >= 0, so a measurer may stop as soon as the KL of the prompts
measured so far, counted over all of them, is refused (before any prompt where ``Refused(0)``: the
record's own KL is refused at the check's level), and return that lower bound, not complete: the
rule refuses the record either way."""


def spread(front: Sequence[T], k: int) -> list[T]:
    """Up to ``k`` records of ``front`` (fastest first) spread evenly over it, the fastest included:
    the calibration learns most from schedules that span the range of drift."""
    if len(front) <= k:
        return list(front)
    picks = sorted({round(i * (len(front) - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]
    return [front[i] for i in picks]


def to_score(front: Sequence[TrialRecord], k: int) -> list[TrialRecord]:
    """The records :func:`pooled_rule` task-scores (step 2): up to ``k`` drifting schedules of the
    feasible ``front`` (fastest first), spread over it. A caller may score them before the rule runs
    (its evidence then hands the results over), so their passes share the unpruned side."""
    return spread([r for r in front if r.loss is not None and r.loss.value > 0], k)


@dataclass(frozen=True)
class Verdict:
    """The rule's judgement of one front record.

    Attributes:
        record: the front record.
        ok: whether the rule accepts it (the pick is the first accepted, fastest first).
        why: the reason, in words.
        fresh_kl: its mean KL on prompts the search never saw (nats; None: not measured).
        fresh_upper: that mean's one-sided bound at ``confidence`` (None: not measured).
    """

    record: TrialRecord
    ok: bool
    why: str
    fresh_kl: float | None = None
    fresh_upper: float | None = None


@dataclass(frozen=True)
class PooledDecision:
    """What :func:`pooled_rule` decided.

    Attributes:
        front: the feasible front, fastest first.
        scored: the task-scored schedules the calibration was fitted on.
        calibration: the fit (None when no scored schedule drifted).
        verdicts: one per front record, in front order.
    """

    front: tuple[TrialRecord, ...]
    scored: tuple[ScoredSchedule, ...]
    calibration: Calibration | None
    verdicts: tuple[Verdict, ...]

    @property
    def picked(self) -> TrialRecord | None:
        """The fastest accepted front record (None: nothing is certified within the budget)."""
        return next((v.record for v in self.verdicts if v.ok), None)


def judged_kl(kl: float, fresh_kl: float | None) -> float:
    """The KL step 5 judges a schedule at: the larger of its KL on the calibration's examples and its
    KL on prompts the search never saw (``kl`` where the latter was not measured)."""
    return kl if fresh_kl is None else max(kl, fresh_kl)


def judged_kl_upper(kl: float, fresh_kl: float | None, fresh_upper: float | None) -> float | None:
    """The one-sided bound of the KL step 5 judges at (:func:`judged_kl`): the fresh KL's, where that
    is the larger and its bound was measured; None where the KL is read as exact."""
    return fresh_upper if fresh_kl is not None and fresh_kl >= kl else None


def judge(
    kl: float,
    calibration: Calibration | None,
    budget: ScoreLoss,
    fresh_kl: float | None = None,
    *,
    complete: bool = True,
    fresh_upper: float | None = None,
    trial: int | None = None,
) -> tuple[bool, str]:
    """Whether a schedule of mean KL ``kl`` (nats, on the calibration's examples) is certified within
    ``budget``, and why; with ``fresh_kl`` (its KL on prompts the search never saw; not ``complete``:
    a lower bound the check stopped at) also at the larger of the two, with ``fresh_upper`` (the fresh
    KL's one-sided bound at ``confidence``) counting its sampling error where the fresh KL is the larger;
    ``trial``: the schedule's trial number (a scored one is covered whatever its KL, step 4)."""
    if kl == 0:
        return True, "no drift (KL 0): the unpruned model's answers"
    if calibration is None:
        return False, "no calibration (no scored schedule drifted)"
    est, up = calibration.predicted(kl)
    covered = calibration.covers(kl, trial)
    ok = up <= budget.budget and covered
    why = (
        f"KL {kl:.4f} nats; {calibration.no_cost_text()}"  # a negative loss is no gain
        if calibration.slope <= 0
        else f"predicted task loss {est:.2f} (upper bound {up:.2f}) score points at KL {kl:.4f} nats "
        f"{'<=' if ok else '>'} budget {budget.budget:g}{calibration.floor_text()}"
    )
    if up <= budget.budget and not covered:
        why += f"; past the largest scored KL {calibration.max_scored_kl:.4f} (no extrapolation)"
    if ok and fresh_kl is not None:
        at = judged_kl(kl, fresh_kl)
        at_upper = judged_kl_upper(kl, fresh_kl, fresh_upper if complete else None)
        est, up = calibration.predicted(at)
        conf = calibration.upper_with_kl_error(at, at_upper)
        bound = up if conf is None else max(up, conf)
        ok = bound <= budget.budget
        level = calibration.level if conf is None else calibration.confidence
        assert level is not None
        more = "no more" if at == kl else "more"
        seen = (
            f"it drifts {more}, KL {fresh_kl:.4f} nats"
            + ("" if at_upper is None or conf is None else f" (at most {at_upper:.4f} at {level:.0%})")
            if complete
            else f"its KL is at least {fresh_kl:.4f} nats on the prompts measured before the check stopped"
            if at > kl
            else "the check stopped before it needed them"
        )
        why += (
            f"; on prompts the search never saw {seen}: at KL {at:.4f} "
            f"predicted task loss {est:.2f} (upper bound at {level:.0%} {bound:.2f}) "
            f"{'<=' if ok else '>'} budget {budget.budget:g}"
        )
    return ok, why


def pooled_rule(
    records: Sequence[TrialRecord],
    search_loss: Loss,
    budget: ScoreLoss,
    k: int,
    weights: Mapping[str, float],
    evidence: Evidence,
    *,
    level: float,
    confidence: float | None = None,
    prior: SlopePrior | None = None,
    baseline_score: float | UnprunedScore | None = None,
    decide_at_bound: bool = False,
    fresh: FreshDrift | None = None,
    exponent: float = LINEAR,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
) -> PooledDecision:
    """The pick of a fidelity study from its ``records`` (see the module docstring).

    Args:
        records: the study's trial records (each complete one with its mean KL and per-example KLs).
        search_loss: the search's loss with its cap (feasibility).
        budget: the user's budget in task-score points.
        k: how many front schedules to task-score (``--confirm-k``).
        weights: example key -> macro weight, on the evidence's examples.
        evidence: scores the chosen records (called once, with all of them).
        level: the slope bound's level that decides (``--decision-level``).
        confidence: the level the calibration also reports (``--confidence``).
        prior: the model's slope prior (``--slope-prior``), the floor of an underpowered calibration.
        baseline_score: the unpruned model's score on the evidence's examples (points, macro), what
            a prior that scales by it is read at: with its bound (:class:`UnprunedScore`, at
            ``confidence``), the certified bound is read at the score's.
        decide_at_bound: the bound that decides is read at the score's bound too
            (``--prior-at-score-bound``; :meth:`Calibration.floored`).
        fresh: a record's KL on prompts the search never saw (step 5), called only on records that
            pass on their own KL, fastest first, until one passes; it may stop once its KL so far is
            refused (:data:`FreshDrift`).
        exponent: the calibration's shape ``p`` (``--calibration-exponent``; ``prior`` must be fitted at it).
    """
    front = feasible_front(records, search_loss)
    chosen = to_score(front, k)
    scored = tuple(evidence(chosen))
    if [s.trial for s in scored] != [r.number for r in chosen]:
        raise ValueError("the evidence must score exactly the records it is given, in their order")
    calibration = fit(
        scored, weights, level=level, confidence=confidence, n_boot=n_boot, seed=seed, exponent=exponent
    )
    if calibration is not None and prior is not None:
        calibration = calibration.floored(
            prior, budget.budget, baseline_score, decide_at_bound=decide_at_bound
        )
    check = fresh is not None and calibration is not None
    verdicts: list[Verdict] = []
    for r in front:
        kl = r.values[1]
        ok, why = judge(kl, calibration, budget, trial=r.number)
        seen = upper = None
        if ok and check and kl > 0 and not any(v.ok for v in verdicts):
            assert fresh is not None

            def refused(at: float, kl: float = kl, trial: int = r.number) -> bool:
                return not judge(kl, calibration, budget, at, trial=trial)[0]

            measured = fresh(r, refused)
            seen, upper = measured.kl, measured.upper
            ok, why = judge(
                kl,
                calibration,
                budget,
                seen,
                complete=measured.complete,
                fresh_upper=measured.upper,
                trial=r.number,
            )
            if ok and not measured.complete:
                raise ValueError(
                    f"the fresh check of trial {r.number} stopped at a KL the rule does not refuse"
                )
        verdicts.append(Verdict(r, ok, why, seen, upper))
    return PooledDecision(tuple(front), scored, calibration, tuple(verdicts))
