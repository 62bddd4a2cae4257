"""What "accuracy loss" means in a study: one object per kind, owning its unit, its budget and how it
is measured. Every plot axis, console line, JSON field and MLflow metric that shows a loss asks the
object for its label and budget, so a KL in nats is never drawn against a budget in score points.

* :class:`FidelityLoss` (``accuracy="fidelity"``): the macro mean over the validation examples of the
  teacher-forced KL(unpruned || pruned) per answer token (:mod:`tuner.evaluation.fidelity`), in **nats**.
* :class:`ScoreLoss` (``accuracy="score"``): the unpruned model's LongBench score minus the
  schedule's (macro average over datasets), in **score points**.

Both stop a schedule early (the trial is PRUNED) once its loss cannot come back within the budget
whatever the remaining examples give. To add a loss: subclass :class:`Loss`, implement
:meth:`Loss.measure`, and register it in :data:`LOSSES`.
"""

from __future__ import annotations

import math
import statistics
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from tuner.evaluation.fidelity import ExampleDrift, FidelityEvaluator
from tuner.evaluation.runner import Evaluator, ExampleResult, loss_estimate, summarize
from tuner.statistics.bootstrap import Estimate, estimate
from tuner.statistics.cap import SearchCap, search_cap

if TYPE_CHECKING:
    from lazyllm.engine import LazyLLM


@dataclass(frozen=True)
class BaselineStats:
    """The unpruned model's LongBench score (0-100) per dataset and its example counts."""

    results: tuple[ExampleResult, ...]
    scores: dict[str, float]
    counts: dict[str, int]

    @classmethod
    def of(cls, results: Sequence[ExampleResult]) -> BaselineStats:
        if not results:
            raise ValueError("the baseline has no examples")
        by: dict[str, list[float]] = {}
        for r in results:
            by.setdefault(r.dataset, []).append(r.score)
        return cls(
            results=tuple(results),
            scores={d: 100.0 * statistics.fmean(s) for d, s in by.items()},
            counts={d: len(s) for d, s in by.items()},
        )


@dataclass(frozen=True)
class MeasureContext:
    """What a loss reads to measure a schedule on one set of examples (and nothing else): the losses
    and the stages that call them share this record instead of importing each other.

    Attributes:
        evaluator: runs the examples (generation and task score).
        fidelity: teacher-forced KL against the unpruned model's references on the same examples.
        baseline: the unpruned model's task scores on the same examples.
        weights: example key (``dataset/record_id``) -> macro weight (each dataset counts once).
        level: the one-sided confidence of a loss's bound (``--confidence``).
    """

    evaluator: Evaluator
    fidelity: FidelityEvaluator
    baseline: BaselineStats
    weights: Mapping[str, float]
    level: float

    def __post_init__(self) -> None:
        if not 0.5 <= self.level < 1:
            raise ValueError(f"confidence level = {self.level}: must be in [0.5, 1)")

    @property
    def total(self) -> int:
        """How many examples a complete measurement runs."""
        return len(self.evaluator.examples)


@dataclass(frozen=True)
class LossResult:
    """One schedule's loss on the examples it ran.

    Attributes:
        estimate: the loss with its uncertainty (None when stopped early).
        per_example: loss per example key (``dataset/record_id``), for the examples run.
        per_dataset: loss per dataset.
        metrics: other numbers (``top1``, ``gold_delta``, ``score``, ``baseline_score``...).
        stopped: why it stopped early, if it did.
        examples_run: how many examples ran.
    """

    estimate: Estimate | None
    per_example: dict[str, float] = field(default_factory=dict)
    per_dataset: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    stopped: str | None = None
    examples_run: int = 0

    def __post_init__(self) -> None:
        if (self.estimate is None) == (self.stopped is None):
            raise ValueError("a loss result has an estimate or a reason it stopped early, exactly one")


@dataclass(frozen=True)
class Rival:
    """A finished, feasible trial that a new schedule of no greater speed must beat on loss.

    Attributes:
        trial: its trial number.
        speedup: its speed objective.
        loss: its loss estimate (the loss's unit).
    """

    trial: int
    speedup: float
    loss: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.speedup) and math.isfinite(self.loss)):
            raise ValueError(f"rival trial {self.trial}: speedup and loss must be finite numbers")


MIN_EXAMPLES_TO_DOMINATE = 5
"""Examples a schedule runs before it may be stopped as dominated by a rival."""


@dataclass(frozen=True)
class Loss(ABC):
    """An accuracy loss with its unit and its budget (the largest loss a user accepts).

    Args:
        budget: in :attr:`unit`; a schedule is within budget when the one-sided upper bound of its
            loss is at most this.
    """

    kind: ClassVar[str]
    unit: ClassVar[str]
    """Short unit for numbers, e.g. ``"nats"``."""
    what: ClassVar[str]
    """What is measured, for axis labels and help texts."""
    digits: ClassVar[int]

    budget: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.budget) and self.budget >= 0):
            raise ValueError(
                f"{self.kind} budget = {self.budget}: must be a finite number >= 0 ({self.unit})"
            )

    @property
    def label(self) -> str:
        """Axis label: ``"accuracy loss: mean KL per answer token (nats)"``."""
        return f"accuracy loss: {self.what} ({self.unit})"

    def text(self, value: float) -> str:
        """``"0.031 nats"``."""
        return f"{value:.{self.digits}f} {self.unit}"

    def within(self, est: Estimate) -> bool:
        """Confidently within budget: the one-sided upper bound is at most the budget."""
        return est.upper <= self.budget

    @abstractmethod
    def measure(
        self, ctx: MeasureContext, engine: LazyLLM, desc: str, rivals: Sequence[Rival] = ()
    ) -> LossResult:
        """The loss of ``engine`` on ``ctx``'s examples, stopping early when it cannot meet the
        budget or (where the loss supports it) once a rival at least as fast confidently beats it."""


@dataclass(frozen=True)
class FidelityLoss(Loss):
    """Teacher-forced KL(unpruned || pruned) per answer token, macro mean over datasets."""

    kind: ClassVar[str] = "fidelity"
    unit: ClassVar[str] = "nats"
    what: ClassVar[str] = "mean KL per answer token"
    digits: ClassVar[int] = 4

    def early_stop(
        self, weights: Mapping[str, float], total: int, drifts: Sequence[ExampleDrift]
    ) -> str | None:
        """Stop once the macro mean KL exceeds the budget even if every remaining example had KL 0."""
        if len(drifts) >= total:
            return None
        norm = sum(weights.values())
        bound = sum(weights[f"{d.dataset}/{d.record_id}"] * d.kl for d in drifts) / norm
        if bound > self.budget:
            return (
                f"mean KL >= {bound:.4f} nats after {len(drifts)} examples even if the rest had none "
                f"(budget {self.budget:g} nats)"
            )
        return None

    def dominated(
        self, weights: Mapping[str, float], total: int, rivals: Sequence[Rival], level: float,
        drifts: Sequence[ExampleDrift],
    ) -> str | None:  # fmt: skip
        """Stop once a rival (at least as fast, by the caller's choice) has a mean KL below the lower
        end of this schedule's two-sided ``level`` interval after :data:`MIN_EXAMPLES_TO_DOMINATE`
        examples or more: the schedule would be dominated on the front."""
        if not rivals or len(drifts) >= total or len(drifts) < MIN_EXAMPLES_TO_DOMINATE:
            return None
        keys = [f"{d.dataset}/{d.record_id}" for d in drifts]
        est = estimate([d.kl for d in drifts], [weights[k] for k in keys], level=level, n_boot=500)
        best = min(rivals, key=lambda r: (r.loss, -r.speedup))
        if est.low > best.loss:
            return (
                f"dominated by trial {best.trial} ({best.speedup:.2f}x, mean KL {best.loss:.4f} nats): "
                f"mean KL >= {est.low:.4f} nats ({level:.0%} interval) after {len(drifts)} examples"
            )
        return None

    def measure(
        self, ctx: MeasureContext, engine: LazyLLM, desc: str, rivals: Sequence[Rival] = ()
    ) -> LossResult:
        drifts, reason = ctx.fidelity.evaluate(
            engine,
            should_stop=lambda d: (
                self.early_stop(ctx.weights, ctx.total, d)
                or self.dominated(ctx.weights, ctx.total, rivals, ctx.level, d)
            ),
            desc=desc,
        )
        if reason:
            return LossResult(None, stopped=reason, examples_run=len(drifts))
        keys = [f"{d.dataset}/{d.record_id}" for d in drifts]
        weights = [ctx.weights[k] for k in keys]
        est = estimate([d.kl for d in drifts], weights, level=ctx.level)
        by: dict[str, list[float]] = {}
        for d in drifts:
            by.setdefault(d.dataset, []).append(d.kl)
        metrics = {"kl": est.value, "top1": estimate([d.top1 for d in drifts], weights).value}
        golds = [d.gold_delta for d in drifts if d.gold_delta is not None]
        if len(golds) == len(drifts):
            metrics["gold_delta"] = estimate(golds, weights).value
        return LossResult(
            est,
            per_example={k: d.kl for k, d in zip(keys, drifts)},
            per_dataset={k: statistics.fmean(v) for k, v in by.items()},
            metrics=metrics,
            examples_run=len(drifts),
        )


def optimistic_loss(
    results: Sequence[ExampleResult], baseline_scores: dict[str, float], counts: dict[str, int]
) -> float:
    """Lowest score loss (points) still reachable if every example not yet run scored 1 (the maximum).

    Args:
        results: the examples run so far.
        baseline_scores: the baseline's LongBench score (0-100) per dataset, on all the examples.
        counts: number of examples per dataset.
    """
    done: dict[str, list[float]] = {}
    for r in results:
        done.setdefault(r.dataset, []).append(r.score)
    best = []
    for dataset, n in counts.items():
        got = done.get(dataset, [])
        best.append(100.0 * (sum(got) + (n - len(got))) / n)
    return statistics.fmean(baseline_scores.values()) - statistics.fmean(best)


@dataclass(frozen=True)
class ScoreLoss(Loss):
    """The unpruned model's LongBench score minus the schedule's, macro average over datasets."""

    kind: ClassVar[str] = "score"
    unit: ClassVar[str] = "score points"
    what: ClassVar[str] = "LongBench score lost"
    digits: ClassVar[int] = 2

    def early_stop(self, base: BaselineStats, results: Sequence[ExampleResult]) -> str | None:
        if len(results) >= sum(base.counts.values()):
            return None  # all examples ran: a complete (possibly infeasible) trial, not a pruned one
        bound = optimistic_loss(results, base.scores, base.counts)
        if bound > self.budget:
            return (
                f"accuracy loss >= {bound:.2f} score points after {len(results)} examples even if the "
                f"rest scored perfectly (budget {self.budget:g} score points)"
            )
        return None

    def measure(
        self, ctx: MeasureContext, engine: LazyLLM, desc: str, rivals: Sequence[Rival] = ()
    ) -> LossResult:
        """The task-score loss (``rivals`` are not used: one example's score says too little)."""
        results, reason = ctx.evaluator.evaluate(
            "lazyllm",
            engine,
            should_stop=lambda r: self.early_stop(ctx.baseline, r),
            desc=desc,
        )
        if reason:
            return LossResult(None, stopped=reason, examples_run=len(results))
        baseline = ctx.baseline.results
        summary = summarize(results, baseline)
        est = loss_estimate(results, baseline, level=ctx.level)
        base = {(b.dataset, b.record_id): b.score for b in baseline}
        return LossResult(
            est,
            per_example={
                f"{r.dataset}/{r.record_id}": 100.0 * (base[(r.dataset, r.record_id)] - r.score)
                for r in results
            },
            per_dataset=summary.dataset_losses(),
            metrics={"score": summary.score, "baseline_score": summary.baseline_score},
            examples_run=len(results),
        )


LOSSES: dict[str, type[Loss]] = {"fidelity": FidelityLoss, "score": ScoreLoss}
"""Loss kind -> class; ``--accuracy`` chooses among these names."""


def make_loss(kind: str, budget: float) -> Loss:
    """The loss named ``kind`` with ``budget`` (in its unit); an unknown name lists the valid ones."""
    if kind not in LOSSES:
        raise ValueError(f"accuracy = {kind!r}: unknown loss. Available: {', '.join(LOSSES)}")
    return LOSSES[kind](budget)


@dataclass(frozen=True)
class Budget:
    """The user's accuracy budget, made once from the settings (:meth:`of`) and passed to every stage.

    Attributes:
        search: the loss the search minimises, with its cap in its own unit (for fidelity the
            :class:`SearchCap`'s nats; the task budget itself for a score search).
        task: the user's budget in task-score points (``--max-accuracy-loss``): what confirmation,
            the decision and the held-out check keep.
        cap: what set a fidelity search's cap (None for a score search).
    """

    search: Loss
    task: ScoreLoss
    cap: SearchCap | None = None

    @classmethod
    def of(
        cls,
        accuracy: str,
        max_accuracy_loss: float,
        max_kl: float | None = None,
        cap: SearchCap | None = None,
    ) -> Budget:
        """The budget of a study measuring ``accuracy`` (a name in :data:`LOSSES`); a fidelity search's
        cap is ``cap``, or :func:`search_cap` without a prior (``max_kl`` or the constant)."""
        task = ScoreLoss(max_accuracy_loss)
        if accuracy == "fidelity":
            chosen = cap if cap is not None else search_cap(max_accuracy_loss, max_kl, None)
            return cls(make_loss(accuracy, chosen.nats), task, chosen)
        return cls(make_loss(accuracy, max_accuracy_loss), task)

    def with_task(self, points: float) -> Budget:
        """The same search cap, with another task budget (``tuner.export --max-accuracy-loss``)."""
        return Budget(self.search, ScoreLoss(points), self.cap)

    @classmethod
    def from_settings(cls, settings: BudgetSettings) -> Budget:
        """The budget a study's settings ask for: the one conversion from the flags. The cap is the
        one the settings carry (``search_cap``/``search_cap_source``/``search_cap_prior``, fixed when
        the study was created); settings without one (a study stored before) get ``max_kl`` or the
        constant, which is what such a study searched with."""
        cap = None
        if settings.search_cap is not None:
            cap = SearchCap(settings.search_cap, settings.search_cap_source, settings.search_cap_prior)
        return cls.of(settings.accuracy, settings.max_accuracy_loss, settings.max_kl, cap)


class BudgetSettings(Protocol):
    """The settings fields a :class:`Budget` is made from (``SearchSettings`` has them)."""

    @property
    def accuracy(self) -> str: ...
    @property
    def max_accuracy_loss(self) -> float: ...
    @property
    def max_kl(self) -> float | None: ...
    @property
    def search_cap(self) -> float | None: ...
    @property
    def search_cap_source(self) -> str: ...
    @property
    def search_cap_prior(self) -> str | None: ...
