"""The held-out stage: the recommendation against the best hand-made schedules, on test.

The yardstick is the two families of hand-made schedules of :mod:`tuner.study.handmade` (paper-style
and one-stage).

Like for like: every hand-made schedule takes the study's revival policy, as every trial did.
The best of each family is picked on the *validation* examples with the search's own loss (the
fastest by the FLOP model whose one-sided upper bound of loss is within the search budget; the
lowest loss if none is). Then the recommendation and both picks are evaluated on the *test* split,
which the search never saw: speedup (robust TTFT or FLOP model) and task-score loss with a paired
bootstrap interval; each pick is compared with the recommendation on the same test examples, and
when the interval of the difference contains 0 the report says that the two cannot be told apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lazyllm.flops import flop_speedup
from lazyllm.schedule import Schedule
from tuner.evaluation.losses import ScoreLoss
from tuner.evaluation.runner import Evaluator, ExampleResult, loss_estimate, macro_score
from tuner.stages.trial import TrialRunner
from tuner.statistics.bootstrap import Estimate, macro_weights, paired_estimate
from tuner.statistics.speed import SpeedMeasurement
from tuner.study.handmade import families
from tuner.study.records import TrialRecord, schedule_key


@dataclass(frozen=True)
class Candidate:
    """A hand-made schedule as seen on validation: FLOP speedup and search loss (None: stopped early)."""

    name: str
    schedule: Schedule
    flop_speedup: float
    loss: Estimate | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "flop_speedup": self.flop_speedup,
            "loss": None if self.loss is None else self.loss.value,
            "upper": None if self.loss is None else self.loss.upper,
        }


def pick(
    runner: TrialRunner, grid: dict[str, Schedule], known: Mapping[str, Estimate] | None = None
) -> tuple[Candidate, list[Candidate]]:
    """The fastest (FLOP model) schedule of ``grid`` whose validation loss bound is within the search's
    budget, else the one with the lowest loss; with every candidate evaluated. ``known``: search losses
    the study already measured, by :func:`~tuner.study.records.schedule_key` (not measured again)."""
    known = known or {}
    seen: list[Candidate] = []
    # fastest first: the first one within budget is the pick, so slower ones need no evaluation
    order = sorted(grid, key=lambda n: -flop_speedup(grid[n], runner.dims, runner.prompt_tokens))
    for name in order:
        est = known.get(schedule_key(grid[name]))
        if est is None:
            est = runner.search_loss.measure(runner.context, runner.engine(grid[name]), name).estimate
        seen.append(
            Candidate(name, grid[name], flop_speedup(grid[name], runner.dims, runner.prompt_tokens), est)
        )
        if est is not None and runner.search_loss.within(est):
            return seen[-1], seen
    return min(seen, key=lambda c: (c.loss.value if c.loss else float("inf"), -c.flop_speedup)), seen


@dataclass(frozen=True)
class HeldoutRow:
    """One schedule on test, with what validation said of it.

    Attributes:
        label: ``recommended`` or ``best <family> (<name>)``.
        validation_speedup: the search's speedup (recommended) or the FLOP model's (hand-made).
        validation_loss: the search loss on validation, in the search loss's unit.
        validation_task_loss: the task-score loss from the confirmation stage (recommended only).
        test_speedup, test_flop_speedup: on the test split's typical prompt; ``test_speedup`` is timed
            (``test_speed_kind``: TTFT, ``measured``, or whole generation, ``total``) even when the
            search used the FLOP model.
        test_loss: task-score loss on test (score points) with its paired bootstrap interval.
    """

    label: str
    schedule: Schedule
    validation_speedup: float
    validation_loss: float | None
    validation_task_loss: Estimate | None
    test_speedup: float
    test_flop_speedup: float
    test_loss: Estimate
    test_score: float
    test_baseline_score: float
    n_validation: int
    n_test: int
    test_speed_kind: str = "measured"

    def to_dict(self, budget: float, unit: str) -> dict[str, Any]:
        return {
            "schedule": self.label,
            "validation_speedup": round(self.validation_speedup, 3),
            "validation_loss": None if self.validation_loss is None else round(self.validation_loss, 4),
            "validation_loss_unit": unit,
            "validation_task_loss": None
            if self.validation_task_loss is None
            else self.validation_task_loss.to_dict(),
            "test_speedup": round(self.test_speedup, 3),
            "test_flop_speedup": round(self.test_flop_speedup, 3),
            "test_speedup_kind": self.test_speed_kind,
            "test_loss": round(self.test_loss.value, 2),
            "test_loss_unit": ScoreLoss.unit,
            "test_loss_interval": [round(self.test_loss.low, 2), round(self.test_loss.high, 2)],
            "test_loss_upper": round(self.test_loss.upper, 2),
            "test_loss_se": self.test_loss.to_dict()["se"],
            # macro over datasets, like the loss: baseline - score = loss (to rounding)
            "test_score": round(self.test_score, 2),
            "test_baseline_score": round(self.test_baseline_score, 2),
            "within_budget": self.test_loss.upper <= budget,
            "n_validation": self.n_validation,
            "n_test": self.n_test,
            "percentiles": list(self.schedule.percentiles),
            "revival": str(self.schedule.revival),
        }


@dataclass(frozen=True)
class Comparison:
    """The paired test-loss difference of two schedules (``loss(label) - loss(other)``, score points);
    :func:`tuner.report.heldout.verdict` says it in words."""

    label: str
    other: str
    difference: Estimate

    @property
    def told_apart(self) -> bool:
        """Whether the interval of the difference excludes 0."""
        return not self.difference.low <= 0.0 <= self.difference.high

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "other": self.other, "difference": self.difference.to_dict()}


@dataclass(frozen=True)
class HeldoutReport:
    """The held-out stage's outcome."""

    level: float
    budget: float
    search_unit: str
    best_hand_made: dict[str, Candidate]
    hand_made_validation: dict[str, list[Candidate]]
    rows: tuple[HeldoutRow, ...]
    comparisons: tuple[Comparison, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "budget": self.budget,
            "budget_unit": ScoreLoss.unit,
            "search_loss_unit": self.search_unit,
            "hand_made_validation": {
                f: {c.name: c.to_dict() for c in cs} for f, cs in self.hand_made_validation.items()
            },
            "best_hand_made": {f: c.name for f, c in self.best_hand_made.items()},
            "rows": [r.to_dict(self.budget, self.search_unit) for r in self.rows],
            "comparisons": [c.to_dict() for c in self.comparisons],
        }


def compare(
    label: str, other: str, rec: list[ExampleResult], hand: list[ExampleResult], level: float
) -> Comparison:
    """Two schedules' test losses on the same examples, paired: ``loss(label) - loss(other)``."""
    diff = paired_estimate(
        [100.0 * r.score for r in hand], [100.0 * r.score for r in rec], macro_weights([r.dataset for r in rec]),
        level=level,
    )  # fmt: skip  # loss(label) - loss(other), in score points
    return Comparison(label, other, diff)


@dataclass(frozen=True)
class Entry:
    """A schedule the held-out check evaluates on test, with what validation said of it.

    Attributes:
        label: ``recommended`` or ``best <family> (<name>)``.
        schedule: the schedule.
        validation_speedup: its speed on validation (the search's objective, or the FLOP model).
        validation_loss: its search loss on validation (None: stopped early).
        validation_task_loss: its task-score loss from confirmation (the recommendation only).
    """

    label: str
    schedule: Schedule
    validation_speedup: float
    validation_loss: float | None
    validation_task_loss: Estimate | None = None


def hand_made_picks(
    runner: TrialRunner, records: Sequence[TrialRecord]
) -> tuple[dict[str, Candidate], dict[str, list[Candidate]]]:
    """Each family's pick on validation, and every candidate evaluated on the way (search losses the
    study already measured are reused, not measured again)."""
    known = {schedule_key(r.schedule): r.loss for r in records if r.loss is not None}
    best: dict[str, Candidate] = {}
    seen: dict[str, list[Candidate]] = {}
    for family, grid in families(
        runner.settings.model, runner.num_layers, runner.settings.revival_policy
    ).items():
        best[family], seen[family] = pick(runner, grid, known)
    return best, seen


def entries(
    recommended: TrialRecord | None, task_loss: Estimate | None, best: Mapping[str, Candidate]
) -> list[Entry]:
    """The recommendation (if any) first, then each family's pick."""
    out = []
    if recommended is not None:
        speedup, loss = recommended.values
        out.append(Entry("recommended", recommended.schedule, speedup, loss, task_loss))
    for family, c in best.items():
        value = None if c.loss is None else c.loss.value
        out.append(Entry(f"best {family} ({c.name})", c.schedule, c.flop_speedup, value))
    return out


def evaluate_on_test(
    runner: TrialRunner, todo: Sequence[Entry]
) -> tuple[list[HeldoutRow], dict[str, list[ExampleResult]]]:
    """Every entry's test row and per-example results. A hand-made pick may be the recommended
    schedule itself: it is evaluated (and timed) once. Speed claims are measured: a FLOP-model search
    still gets its TTFT timed here, side by side."""
    settings = runner.settings
    test = Evaluator(
        runner.model, runner.tokenizer, settings.evidence_settings("heldout"), settings.study_dir / "cache",
        progress=runner.evaluator.progress,
    )  # fmt: skip
    test_runner = runner.with_evaluator(test)
    # every distinct schedule and the baseline in one pass: one unpruned prefill per test example,
    # each schedule resuming from it, a chunk of examples decoded together (the same answers)
    distinct = {schedule_key(e.schedule): e.schedule for e in todo}
    engines = {i: test_runner.engine(s) for i, s in enumerate(distinct.values())}
    scored = test_runner.fidelity.score_together(engines, kl=False, desc=f"test: {len(engines)} schedules")
    base_test = test.baseline_results()
    timed = "measured" if settings.speedup == "flops" else settings.speedup
    rows: list[HeldoutRow] = []
    results: dict[str, list[ExampleResult]] = {}
    evaluated: dict[str, tuple[list[ExampleResult], SpeedMeasurement | None]] = {}
    for i, (key, schedule) in enumerate(distinct.items()):
        evaluated[key] = (scored[i][0], test_runner.measure_speed(engines[i], schedule, timed))
    for e in todo:
        res, speed = evaluated[schedule_key(e.schedule)]
        results[e.label] = res
        flops = flop_speedup(e.schedule, test_runner.dims, test_runner.prompt_tokens)
        rows.append(
            HeldoutRow(
                label=e.label,
                schedule=e.schedule,
                validation_speedup=e.validation_speedup,
                validation_loss=e.validation_loss,
                validation_task_loss=e.validation_task_loss,
                test_speedup=speed.speedup if speed is not None else flops,
                test_flop_speedup=flops,
                test_loss=loss_estimate(res, base_test, level=settings.confidence),
                test_score=macro_score(res),
                test_baseline_score=macro_score(base_test),
                n_validation=len(runner.evaluator.examples),
                n_test=len(test.examples),
                test_speed_kind=timed,
            )
        )
    return rows, results


def heldout_check(
    runner: TrialRunner,
    recommended: TrialRecord | None,
    task_loss: Estimate | None = None,
    records: Sequence[TrialRecord] = (),
) -> HeldoutReport:
    """Best hand-made schedules (picked on validation) vs the recommendation, on test; see the module
    docstring. ``records``: the study's trials, whose complete losses the validation picks reuse."""
    best, seen = hand_made_picks(runner, records)
    todo = entries(recommended, task_loss, best)
    rows, results = evaluate_on_test(runner, todo)
    level = runner.settings.confidence
    comparisons: tuple[Comparison, ...] = ()
    if "recommended" in results:
        comparisons = tuple(
            compare("recommended", e.label, results["recommended"], results[e.label], level) for e in todo[1:]
        )
    return HeldoutReport(
        level=level,
        budget=runner.budget.task.budget,
        search_unit=runner.search_loss.unit,
        best_hand_made=best,
        hand_made_validation=seen,
        rows=tuple(rows),
        comparisons=comparisons,
    )
