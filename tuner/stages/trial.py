"""The trial stage: one proposed schedule -> one :class:`~tuner.study.records.TrialRecord`.

* Objectives: ``(speedup, accuracy_loss)`` with ``directions=["maximize", "minimize"]``. Speedup is
  the robust measurement of :mod:`tuner.statistics.speed` (TTFT with ``speedup="measured"``, the whole
  generation with ``"total"``; interleaved timings on the example of typical length, minimum per
  side, checked against the FLOP model) or the FLOP model's (``"flops"``); only the speedup the
  objective names is timed. The loss is the study's :class:`~tuner.evaluation.losses.Loss`.
* Constraint: the one-sided upper bound (level ``confidence``, bootstrap over examples) of the loss
  minus the loss's budget, so "feasible" means confidently within budget. A trial stops early
  (PRUNED, the reason in its record) once its loss cannot meet the budget, or, in a FLOP-model
  search (where a schedule's speed is known before it runs), once a finished feasible trial at least
  as fast confidently beats its loss (:meth:`tuner.evaluation.losses.FidelityLoss.dominated`): it would be
  dominated on the front, so its remaining examples are not spent.
* A sampler's proposal the FLOP model puts below ``min_speedup`` is stopped before it runs (PRUNED,
  the reason in its record, and a second constraint, ``min_speedup``, over zero: infeasible), so the
  sampler leaves the slow end of the front, where nothing is worth picking; it takes its slot.
* A proposal that repeats a schedule the study already evaluated (or is evaluating) takes no slot:
  the trial is refused (PRUNED with system attr ``duplicate_of``, not counted towards ``n_trials``)
  and a fresh random draw from the space is queued, so the next trial explores.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import InitVar, dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

import lazyllm
from lazyllm.engine import LazyLLM
from lazyllm.flops import ModelDims, flop_speedup
from lazyllm.schedule import Schedule
from tuner.evaluation.fidelity import PREFIX_MEMORY_SHARE, FidelityEvaluator
from tuner.evaluation.losses import BaselineStats, Budget, Loss, LossResult, MeasureContext, Rival
from tuner.evaluation.runner import Evaluator
from tuner.statistics.bootstrap import macro_weights
from tuner.statistics.speed import (
    SpeedMeasurement,
    generation_timer,
    measure_speedup,
    prefill_timer,
    resolve_clock,
)
from tuner.study.records import TrialRecord, schedule_key
from tuner.study.settings import EvalSettings, SearchSettings
from tuner.study.spaces import SearchSpace
from tuner.study.workers import DUPLICATE_ATTR, DuplicateSchedule, SurplusTrial, is_surplus


def prefix_share(settings: SearchSettings) -> float:
    """The share of free memory each evaluator of one worker may keep prefills in: the local workers
    start together and would each see all of it."""
    return PREFIX_MEMORY_SHARE / settings.n_workers


def fidelity_of(
    settings: SearchSettings, evaluator: Evaluator, *, prefix_bytes: int | None = None
) -> FidelityEvaluator:
    """The study's fidelity evaluator on ``evaluator``'s examples (``prefix_bytes``: what its kept
    prefills may hold, 0 for none; None: the worker's share of free memory)."""
    return FidelityEvaluator(
        evaluator,
        top_k=settings.fidelity_top_k,
        gold=settings.fidelity_gold,
        prefix_bytes=prefix_bytes,
        prefix_share=prefix_share(settings),
    )


SPEED_FLOOR_CONSTRAINT = "min_speedup"
"""The constraint a proposal below the speed floor carries (``--min-speedup`` minus its FLOP speedup,
> 0): Optuna's samplers rank it behind every feasible trial."""


def fresh_draw(space: SearchSpace, num_layers: int, study_seed: int, trial_number: int) -> dict[str, Any]:
    """Random parameters of ``space`` to queue in place of a refused duplicate: reproducible from the
    study's seed and the trial number, and different between seeds (seeded by the trial number alone,
    the draws of seeds 0 and 1 were the same, so both studies evaluated the same replacements)."""
    seed = int(np.random.SeedSequence([study_seed, trial_number]).generate_state(1)[0])
    fresh = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed)).ask()
    space.suggest_params(fresh, num_layers)
    return dict(fresh.params)


@dataclass
class TrialRunner:
    """Runs the trials of one study (one per process; nothing shared between trials but the caches).

    Cheap to build: the baseline is computed (or read from its cache) beforehand and passed in; the
    fidelity reference is computed (or read) by :meth:`prepare` or on first use.
    """

    settings: SearchSettings
    model: Any
    tokenizer: Any
    evaluator: Evaluator
    space: SearchSpace
    baseline: BaselineStats
    budget: Budget
    shared_fidelity: InitVar[FidelityEvaluator | None] = None  # one built on this evaluator (build)

    @classmethod
    def build(
        cls, settings: SearchSettings, model: Any, tokenizer: Any, evaluator: Evaluator, space: SearchSpace,
        budget: Budget, fidelity: FidelityEvaluator | None = None,
    ) -> TrialRunner:  # fmt: skip
        """A runner on ``evaluator``'s examples with their baseline computed (or read): for a fidelity
        search together with the fidelity reference, from one unpruned prefill per example
        (:meth:`FidelityEvaluator.references`), and only then read as the baseline. ``fidelity``: the
        study's fidelity evaluator on ``evaluator`` (built here when None)."""
        if fidelity is None or fidelity.evaluator is not evaluator:
            fidelity = fidelity_of(settings, evaluator)
        if budget.search.kind == "fidelity":
            fidelity.references()
        stats = BaselineStats.of(evaluator.baseline_results())
        return cls(settings, model, tokenizer, evaluator, space, stats, budget, fidelity)

    def __post_init__(self, shared_fidelity: FidelityEvaluator | None) -> None:
        self.num_layers = int(self.model.config.num_hidden_layers)
        self.dims = ModelDims.from_config(self.model.config)
        examples = self.evaluator.examples
        mean = round(statistics.fmean(len(e.input_ids) for e in examples))
        # a multi-fidelity search's trials run on prompts shorter than the ones it decides for: the FLOP
        # model (its speed objective) reads the target budget, what prompts are cut or built to
        short = self.evaluator.config.max_prompt_tokens < self.settings.max_prompt_tokens
        self.prompt_tokens = self.settings.max_prompt_tokens if short else mean
        # speed is timed on the example closest to the mean prompt length (TTFT is near-deterministic
        # per schedule and length, so one prompt timed robustly beats many timed once)
        self.timing_example = min(examples, key=lambda e: (abs(len(e.input_ids) - mean), e.key))
        self.weights = dict(zip((e.key for e in examples), macro_weights([e.dataset for e in examples])))
        self.fidelity = (
            shared_fidelity
            if shared_fidelity is not None and shared_fidelity.evaluator is self.evaluator
            else fidelity_of(self.settings, self.evaluator)
        )
        self.baseline_engine = self.engine(Schedule.keep_all(self.settings.model, self.num_layers))

    def prepare(self) -> None:
        """Compute (or read) what every trial shares: the unpruned side of a fidelity search."""
        if self.search_loss.kind == "fidelity":
            self.fidelity.references()

    @property
    def context(self) -> MeasureContext:
        """What the losses read to measure a schedule on this runner's examples."""
        return MeasureContext(
            self.evaluator, self.fidelity, self.baseline, self.weights, self.settings.confidence
        )

    @property
    def search_loss(self) -> Loss:
        """What the search minimises, with its cap."""
        return self.budget.search

    def engine(self, schedule: Schedule) -> LazyLLM:
        return LazyLLM(self.model, schedule, tokenizer=self.tokenizer, strict_model_name=False)

    def with_evaluator(self, evaluator: Evaluator) -> TrialRunner:
        """The same study on other examples (the held-out check's test split), its baseline kept."""
        return TrialRunner(
            self.settings, self.model, self.tokenizer, evaluator, self.space, self.baseline, self.budget
        )

    def on(self, config: EvalSettings, fidelity: FidelityEvaluator | None = None) -> TrialRunner:
        """The same study on the examples ``config`` names, with their own baseline (computed once,
        then read from the study's cache); itself when ``config`` names the search's examples.
        ``fidelity``: :meth:`fidelity_on` ``config``, when its caches were already filled."""
        if config == self.evaluator.config.eval_only():
            return self
        fid = fidelity if fidelity is not None else self.fidelity_on(config)
        return TrialRunner.build(
            self.settings, self.model, self.tokenizer, fid.evaluator, self.space, self.budget, fid
        )

    def at_target(self) -> TrialRunner:
        """The same study on the search's examples at the target prompt length (``max_prompt_tokens``),
        with their own baseline and unpruned side; itself unless the trials ran on shorter prompts
        (``search_prompt_tokens``)."""
        return self.on(self.settings.eval_only())

    def fidelity_on(self, config: EvalSettings) -> FidelityEvaluator:
        """The study's fidelity evaluator on the examples ``config`` names, with the search's unpruned
        side of the examples both hold and nothing computed yet (the runner's own when ``config``
        names the search's examples): what scores schedules there
        together with the unpruned side (:meth:`FidelityEvaluator.score_together`) before
        :meth:`on` reads that side from the caches."""
        if config == self.evaluator.config.eval_only():
            return self.fidelity
        evaluator = Evaluator(
            self.model,
            self.tokenizer,
            config,
            self.settings.study_dir / "cache",
            progress=self.evaluator.progress,
        )
        fidelity = fidelity_of(self.settings, evaluator)
        fidelity.adopt(self.fidelity)  # the examples both hold: the search's unpruned side, as computed
        return fidelity

    # --- the objective, as named steps ------------------------------------------------------------
    def objective(self, trial: optuna.Trial) -> tuple[float, float]:
        self.check_slot(trial)
        start = time.perf_counter()
        schedule = self.propose(trial)
        self.refuse_duplicate(trial, schedule)
        self.refuse_slow(trial, schedule, start)
        engine = self.engine(schedule)
        rivals = self.rivals(trial.study, schedule)
        measured = self.search_loss.measure(self.context, engine, f"trial {trial.number}", rivals)
        if measured.estimate is None:
            self.record(trial, schedule, measured, None, start).store(trial)
            raise optuna.TrialPruned(measured.stopped)
        speed = self.measure_speed(engine, schedule)
        record = self.record(trial, schedule, measured, speed, start)
        record.store(trial)
        trial.set_constraint("accuracy_loss", measured.estimate.upper - self.search_loss.budget)
        return record.values

    def check_slot(self, trial: optuna.Trial) -> None:
        if is_surplus(trial.study, trial.number, self.settings.n_trials):
            trial.set_user_attr("surplus", True)
            raise SurplusTrial(f"trial {trial.number}: the study already has {self.settings.n_trials} trials")

    def propose(self, trial: optuna.Trial) -> Schedule:
        """The space's schedule for this trial (keep-all for the reference trial), with the study's
        decoding policy."""
        return self.space.trial_schedule(trial, self.settings.model, self.num_layers).with_revival(
            self.settings.revival_policy
        )

    def rivals(self, study: optuna.Study, schedule: Schedule) -> list[Rival]:
        """The finished feasible trials at least as fast as ``schedule``: a schedule one of them
        confidently beats on loss is stopped early as dominated. Only a FLOP-model search knows a
        schedule's speed before evaluating it, so only it has rivals."""
        if self.settings.speedup != "flops":
            return []
        speed = flop_speedup(schedule, self.dims, self.prompt_tokens)
        out = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            record = TrialRecord.from_trial(t, self.settings.model)
            if record is None or record.loss is None or not self.search_loss.within(record.loss):
                continue
            if record.values[0] >= speed:
                out.append(Rival(t.number, record.values[0], record.values[1]))
        return out

    def refuse_slow(self, trial: optuna.Trial, schedule: Schedule, start: float) -> None:
        """Stop a sampler's proposal the FLOP model puts below ``min_speedup`` before it runs a single
        example: PRUNED with its record (the reason, no examples run) and the constraint
        :data:`SPEED_FLOOR_CONSTRAINT` (how far below the floor), so the sampler counts it infeasible
        and leaves that region. Queued trials (the reference, the warm starts, a duplicate's fresh
        draw, a user's queued schedule) always run. It takes its slot of ``n_trials``."""
        floor = self.settings.min_speedup
        if floor <= 1.0 or "fixed_params" in trial.storage.get_trial_system_attrs(trial._trial_id):
            return
        speed = flop_speedup(schedule, self.dims, self.prompt_tokens)
        if speed >= floor:
            return
        reason = f"{speed:.3f}x by the FLOP model, under --min-speedup {floor:g}: not evaluated"
        self.record(trial, schedule, LossResult(None, stopped=reason), None, start).store(trial)
        trial.set_constraint(SPEED_FLOOR_CONSTRAINT, floor - speed)
        raise optuna.TrialPruned(reason)

    def evaluated(self, study: optuna.Study, before: int) -> dict[str, int]:
        """Schedule key -> trial number, for every trial numbered below ``before`` that evaluated (or
        is evaluating) a schedule."""
        seen: dict[str, int] = {}
        for t in study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
        ):
            if t.number >= before or DUPLICATE_ATTR in t.system_attrs:
                continue
            record = TrialRecord.from_trial(t, self.settings.model)
            if record is not None:
                seen.setdefault(schedule_key(record.schedule), t.number)
            elif t.state == TrialState.RUNNING and t.params:
                try:
                    sched = self.space.to_schedule(t.params, self.settings.model, self.num_layers)
                except ValueError:
                    continue
                seen.setdefault(schedule_key(sched.with_revival(self.settings.revival_policy)), t.number)
        return seen

    def refuse_duplicate(self, trial: optuna.Trial, schedule: Schedule) -> None:
        """Refuse a schedule the study already holds, and queue a fresh random draw instead."""
        earlier = self.evaluated(trial.study, trial.number).get(schedule_key(schedule))
        if earlier is None:
            return
        trial.storage.set_trial_system_attr(trial._trial_id, DUPLICATE_ATTR, earlier)
        trial.study.enqueue_trial(fresh_draw(self.space, self.num_layers, self.settings.seed, trial.number))
        raise DuplicateSchedule(f"trial {trial.number}: the schedule of trial {earlier}; queued a fresh draw")

    def measure_speed(
        self, engine: LazyLLM, schedule: Schedule, kind: str | None = None
    ) -> SpeedMeasurement | None:
        """The robust speedup ``kind`` names (default: the objective's; None for the FLOP model): TTFT
        (``measured``) or whole generation (``total``) on the timing example (see :mod:`tuner.statistics.speed`)."""
        kind = self.settings.speedup if kind is None else kind
        if kind == "flops":
            return None
        import torch

        ids = torch.tensor(self.timing_example.input_ids)
        flops = flop_speedup(schedule, self.dims, len(self.timing_example.input_ids))
        clock = resolve_clock(self.settings.timing_clock, engine.device)
        if kind == "measured":
            return measure_speedup(
                prefill_timer(self.baseline_engine, ids, clock),
                prefill_timer(engine, ids, clock),
                flops,
                rounds=self.settings.timing_rounds,
                clock=clock,
            )
        # the FLOP model describes the prefill only, so the plausibility check is left wide open
        new = self.settings.timed_new_tokens or self.timing_example.max_new_tokens
        return measure_speedup(
            generation_timer(self.baseline_engine, ids, new, clock),
            generation_timer(engine, ids, new, clock),
            flops,
            rounds=self.settings.timing_rounds,
            plausible=(1e-3, 1e3),
            clock=clock,
        )

    def record(
        self,
        trial: optuna.Trial,
        schedule: Schedule,
        measured: LossResult,
        speed: SpeedMeasurement | None,
        start: float,
    ) -> TrialRecord:
        flops = flop_speedup(schedule, self.dims, self.prompt_tokens)
        computed = (
            100.0 * sum(schedule.keep_counts(self.prompt_tokens)) / (self.prompt_tokens * self.num_layers)
        )
        complete = measured.estimate is not None
        return TrialRecord(
            number=trial.number,
            schedule=schedule,
            params=dict(trial.params),
            accuracy=self.search_loss.kind,
            flop_speedup=flops,
            prompt_computed_pct=computed,
            examples_run=measured.examples_run,
            loss=measured.estimate,
            speedup=(speed.speedup if speed is not None else flops) if complete else None,
            speed=speed,
            stopped=measured.stopped,
            metrics=measured.metrics,
            per_dataset=measured.per_dataset,
            per_example=measured.per_example,
            provenance={
                "model": self.settings.model,
                "task": self.settings.task,
                "sampler": self.settings.sampler,
                "seed": self.settings.seed,
                "speedup_kind": self.settings.speedup,
                "timing_example": self.timing_example.key,
                "timing_prompt_tokens": len(self.timing_example.input_ids),
                "wall_time_s": time.perf_counter() - start,
                "lazyllm_version": lazyllm.__version__,
            },
        )
