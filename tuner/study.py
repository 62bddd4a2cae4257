"""One Optuna study: maximise TTFT speedup, minimise accuracy loss, over a search space of schedules.

* Objectives: ``(speedup, accuracy_loss)`` with ``directions=["maximize", "minimize"]``.
  Speedup is the robust TTFT measurement of :mod:`tuner.speed` (interleaved timings on the example of
  typical length, minimum per side, checked against the FLOP model; ``speedup="measured"``) or the
  FLOP model's (``"flops"``). Accuracy loss is, per ``accuracy``:
  ``"fidelity"`` the macro mean over the validation examples of the teacher-forced KL(unpruned ||
  pruned) per answer token (:mod:`tuner.fidelity`, nats), or ``"score"`` the baseline's LongBench
  score minus the schedule's (macro average, score points).
* Constraint: the one-sided upper bound (level ``confidence``, paired bootstrap over examples) of the
  loss must be within the budget (``max_kl`` for fidelity, ``max_accuracy_loss`` for score), so
  "feasible" means confidently within budget. A trial stops early (PRUNED, reason in its user attrs)
  once its loss cannot meet the budget whatever the remaining examples give.
* Every complete trial stores one :class:`~tuner.records.TrialRecord` (user attr ``"record"``).
* Warm start: keep-all and a paper-style progressive schedule are enqueued when the study is new.
* Resume: the same study name and storage continue the study until it holds ``n_trials`` finished
  trials; the baseline (and the fidelity reference) come from the on-disk cache.
"""

from __future__ import annotations

import fcntl
import math
import statistics
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

import lazyllm
from lazyllm.engine import LazyLLM
from lazyllm.flops import ModelDims, flop_speedup
from lazyllm.schedule import Revival, Schedule
from tuner.evaluation import Evaluator, ExampleResult, loss_estimate, summarize
from tuner.fidelity import ExampleDrift, FidelityEvaluator
from tuner.records import RECORD_ATTR, TrialRecord
from tuner.redact import redact_text
from tuner.samplers import make_sampler
from tuner.settings import SearchSettings
from tuner.spaces import SearchSpace
from tuner.speed import SpeedMeasurement, generation_timer, measure_speedup, prefill_timer, resolve_clock
from tuner.stats import Estimate, estimate, macro_weights
from tuner.stores import create_sqlite_atomically, sqlite_path
from tuner.workers import SurplusTrial, is_surplus

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
TOTAL_SIDE_ROUNDS = 2
"""Timing rounds of the speedup that is recorded but is not the objective (TTFT or total)."""


def optimistic_loss(
    results: Sequence[ExampleResult], baseline_scores: dict[str, float], counts: dict[str, int]
) -> float:
    """Lowest accuracy loss still reachable if every example not yet run scored 1 (the maximum).

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
class LossResult:
    """The accuracy side of one schedule on the examples.

    Attributes:
        estimate: the loss with its uncertainty (None when stopped early).
        per_example: loss per example key, for the examples run.
        per_dataset: loss per dataset.
        metrics: other numbers (``score``, ``top1``, ``gold_delta``...).
        reason: why it stopped early, if it did.
    """

    estimate: Estimate | None
    per_example: dict[str, float]
    per_dataset: dict[str, float]
    metrics: dict[str, float]
    reason: str | None = None
    examples_run: int = 0


@dataclass
class StudyRunner:
    """Runs the trials of one study (one per process; no state shared between trials but the caches).

    Cheap to build: the baseline is computed (or read from its cache) beforehand and passed in; the
    fidelity reference is computed (or read) on first use.
    """

    settings: SearchSettings
    model: Any
    tokenizer: Any
    evaluator: Evaluator
    space: SearchSpace
    baseline: BaselineStats

    def __post_init__(self) -> None:
        self.num_layers = int(self.model.config.num_hidden_layers)
        self.dims = ModelDims.from_config(self.model.config)
        examples = self.evaluator.examples
        self.prompt_tokens = round(statistics.fmean(len(e.input_ids) for e in examples))
        # speed is timed on the example closest to the mean prompt length (TTFT is near-deterministic
        # per schedule and length, so one prompt timed robustly beats many timed once)
        self.timing_example = min(examples, key=lambda e: (abs(len(e.input_ids) - self.prompt_tokens), e.key))
        self.weights = dict(zip((e.key for e in examples), macro_weights([e.dataset for e in examples])))
        self.fidelity = FidelityEvaluator(
            self.evaluator, top_k=self.settings.fidelity_top_k, gold=self.settings.fidelity_gold
        )
        self.baseline_engine = LazyLLM(
            self.model, Schedule.keep_all(self.settings.model, self.num_layers), tokenizer=self.tokenizer,
            strict_model_name=False,
        )  # fmt: skip

    @property
    def budget(self) -> float:
        """The search's loss budget, in the unit of the accuracy objective."""
        return (
            self.settings.max_kl if self.settings.accuracy == "fidelity" else self.settings.max_accuracy_loss
        )

    def early_stop(self, results: list[ExampleResult]) -> str | None:
        if len(results) >= sum(self.baseline.counts.values()):
            return None  # all examples ran: a complete (possibly infeasible) trial, not a pruned one
        bound = optimistic_loss(results, self.baseline.scores, self.baseline.counts)
        if bound > self.settings.max_accuracy_loss:
            return (
                f"accuracy loss >= {bound:.2f} after {len(results)} examples even if the rest scored "
                f"perfectly (budget {self.settings.max_accuracy_loss})"
            )
        return None

    def early_stop_fidelity(self, drifts: list[ExampleDrift]) -> str | None:
        """Stop once the macro mean KL exceeds the budget even if every remaining example had KL 0."""
        if len(drifts) >= len(self.evaluator.examples):
            return None
        total = sum(self.weights.values())
        bound = sum(self.weights[f"{d.dataset}/{d.record_id}"] * d.kl for d in drifts) / total
        if bound > self.settings.max_kl:
            return (
                f"mean KL >= {bound:.4f} after {len(drifts)} examples even if the rest had none "
                f"(budget {self.settings.max_kl})"
            )
        return None

    @staticmethod
    def _same_schedule(study: optuna.Study, schedule: Schedule) -> FrozenTrial | None:
        """A complete trial of ``study`` that evaluated exactly ``schedule``, if any."""
        wanted = list(schedule.percentiles)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.values and t.user_attrs.get("percentiles") == wanted:
                return t
        return None

    def measure_speed(self, engine: LazyLLM, schedule: Schedule) -> SpeedMeasurement:
        """Robust TTFT speedup of ``engine`` on the timing example (see :mod:`tuner.speed`)."""
        import torch

        ids = torch.tensor(self.timing_example.input_ids)
        flops = flop_speedup(schedule, self.dims, len(self.timing_example.input_ids))
        rounds = self.settings.timing_rounds if self.settings.speedup == "measured" else TOTAL_SIDE_ROUNDS
        clock = resolve_clock(self.settings.timing_clock, engine.device)
        return measure_speedup(
            prefill_timer(self.baseline_engine, ids, clock),
            prefill_timer(engine, ids, clock),
            flops,
            rounds=rounds,
            clock=clock,
        )

    def measure_total(self, engine: LazyLLM, schedule: Schedule) -> SpeedMeasurement:
        """Robust whole-generation speedup (prefill + ``new_tokens`` decoding steps) on the timing example.

        The FLOP model describes the prefill only, so the plausibility check is left wide open here.
        """
        import torch

        ids = torch.tensor(self.timing_example.input_ids)
        new = self.settings.new_tokens or self.timing_example.max_new_tokens
        flops = flop_speedup(schedule, self.dims, len(self.timing_example.input_ids))
        rounds = self.settings.timing_rounds if self.settings.speedup == "total" else TOTAL_SIDE_ROUNDS
        clock = resolve_clock(self.settings.timing_clock, engine.device)
        return measure_speedup(
            generation_timer(self.baseline_engine, ids, new, clock),
            generation_timer(engine, ids, new, clock),
            flops,
            rounds=rounds,
            plausible=(1e-3, 1e3),
            clock=clock,
        )

    def score_loss(self, engine: LazyLLM, desc: str) -> LossResult:
        """Task-score loss (score points) on every example, stopping early when it cannot meet the budget."""
        results, reason = self.evaluator.evaluate("lazyllm", engine, should_stop=self.early_stop, desc=desc)
        if reason:
            return LossResult(None, {}, {}, {}, reason, len(results))
        summary = summarize(results, self.baseline.results)
        est = loss_estimate(results, self.baseline.results, level=self.settings.confidence)
        base = {(b.dataset, b.record_id): b.score for b in self.baseline.results}
        per_example = {
            f"{r.dataset}/{r.record_id}": 100.0 * (base[(r.dataset, r.record_id)] - r.score) for r in results
        }
        per_dataset = {
            d: float(summary["baseline_dataset_scores"][d]) - float(v)
            for d, v in summary["dataset_scores"].items()
        }
        metrics = {
            "score": float(summary["score"]),
            "baseline_score": float(summary["baseline_score"]),
        }  # the total speedup is measured by measure_total (tuner.speed), not from the scoring runs
        return LossResult(est, per_example, per_dataset, metrics, None, len(results))

    def fidelity_loss(self, engine: LazyLLM, desc: str) -> LossResult:
        """Fidelity loss (mean KL per answer token, nats), stopping early when it cannot meet the budget."""
        drifts, reason = self.fidelity.evaluate(engine, should_stop=self.early_stop_fidelity, desc=desc)
        if reason:
            return LossResult(None, {}, {}, {}, reason, len(drifts))
        keys = [f"{d.dataset}/{d.record_id}" for d in drifts]
        weights = [self.weights[k] for k in keys]
        est = estimate([d.kl for d in drifts], weights, level=self.settings.confidence)
        by: dict[str, list[float]] = {}
        for d in drifts:
            by.setdefault(d.dataset, []).append(d.kl)
        metrics = {"kl": est.value, "top1": estimate([d.top1 for d in drifts], weights).value}
        golds = [d.gold_delta for d in drifts if d.gold_delta is not None]
        if len(golds) == len(drifts):
            metrics["gold_delta"] = estimate(golds, weights).value
        per_example = {k: d.kl for k, d in zip(keys, drifts)}
        per_dataset = {k: statistics.fmean(v) for k, v in by.items()}
        return LossResult(est, per_example, per_dataset, metrics, None, len(drifts))

    def loss(self, engine: LazyLLM, desc: str) -> LossResult:
        """The study's accuracy objective (``settings.accuracy``) for ``engine``."""
        if self.settings.accuracy == "fidelity":
            return self.fidelity_loss(engine, desc)
        return self.score_loss(engine, desc)

    def objective(self, trial: optuna.Trial) -> tuple[float, float]:
        if is_surplus(trial.study, trial.number, self.settings.n_trials):
            trial.set_user_attr("surplus", True)
            raise SurplusTrial(f"trial {trial.number}: the study already has {self.settings.n_trials} trials")
        start = time.perf_counter()
        schedule = self.space.suggest(trial, self.settings.model, self.num_layers)
        schedule = schedule.with_revival(self.settings.revival)  # the study's decoding policy (identity)
        flops = flop_speedup(schedule, self.dims, self.prompt_tokens)
        trial.set_user_attr("percentiles", list(schedule.percentiles))
        trial.set_user_attr("revival", str(schedule.revival))
        trial.set_user_attr("flop_speedup", flops)
        earlier = self._same_schedule(trial.study, schedule)
        if earlier is not None:  # evaluated already: reuse, do not spend minutes on it again
            for key, value in earlier.user_attrs.items():
                if key not in ("percentiles", "flop_speedup"):
                    trial.set_user_attr(key, value)
            trial.set_user_attr("duplicate_of", earlier.number)
            for key, value in earlier.constraints.items():
                trial.set_constraint(key, value)
            return float(earlier.values[0]), float(earlier.values[1])
        engine = LazyLLM(self.model, schedule, tokenizer=self.tokenizer, strict_model_name=False)
        out = self.loss(engine, f"trial {trial.number}")
        trial.set_user_attr("examples_run", out.examples_run)
        est, per_example, per_dataset, metrics = out.estimate, out.per_example, out.per_dataset, out.metrics
        if out.reason or est is None:
            trial.set_user_attr("wall_time_s", time.perf_counter() - start)
            trial.set_user_attr("stopped_early", out.reason)
            raise optuna.TrialPruned(out.reason)
        # both speedups are recorded whenever timing is on; the objective is the one --speedup names
        ttft = self.measure_speed(engine, schedule) if self.settings.speedup != "flops" else None
        total = self.measure_total(engine, schedule) if self.settings.speedup != "flops" else None
        speed = total if self.settings.speedup == "total" else ttft
        wall = time.perf_counter() - start
        computed = (
            100.0 * sum(schedule.keep_counts(self.prompt_tokens)) / (self.prompt_tokens * self.num_layers)
        )
        record = TrialRecord(
            number=trial.number,
            percentiles=schedule.percentiles,
            params=dict(trial.params),
            accuracy=self.settings.accuracy,
            speedup=speed.speedup if speed is not None else flops,
            loss=est,
            flop_speedup=flops,
            prompt_computed_pct=computed,
            speed=speed,
            metrics=metrics,
            per_dataset=per_dataset,
            per_example=per_example,
            provenance={
                "model": self.settings.model,
                "task": self.settings.task,
                "sampler": self.settings.sampler,
                "seed": self.settings.seed,
                "speedup_kind": self.settings.speedup,
                "timing_example": self.timing_example.key,
                "timing_prompt_tokens": len(self.timing_example.input_ids),
                "wall_time_s": wall,
                "lazyllm_version": lazyllm.__version__,
            },
        )
        trial.set_user_attr(RECORD_ATTR, record.to_dict())
        # the keys older readers (export, MLflow tracking) look up; the record is the source
        trial.set_user_attr("wall_time_s", wall)
        trial.set_user_attr("prompt_computed_pct", computed)
        trial.set_user_attr("dataset_scores", per_dataset if self.settings.accuracy == "score" else {})
        trial.set_user_attr("dataset_loss", per_dataset)
        trial.set_user_attr("accuracy_loss_interval", [est.low, est.high])
        trial.set_user_attr("accuracy_loss_upper", est.upper)
        trial.set_user_attr("accuracy_loss_se", est.se if math.isfinite(est.se) else None)
        for key in ("score", "baseline_score", "total_speedup", "top1", "gold_delta"):
            if key in metrics:
                trial.set_user_attr(key, metrics[key])
        if ttft is not None and total is not None:
            trial.set_user_attr("measured_ttft_speedup", ttft.speedup)
            trial.set_user_attr("measured_total_speedup", total.speedup)
        # read by the samplers: feasible when the one-sided upper bound is within budget
        trial.set_constraint("accuracy_loss", est.upper - self.budget)
        return record.speedup, est.value


@contextmanager
def study_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder/.lock`` (POSIX ``flock``) for this machine's workers."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _rdb_storage(url: str, heartbeat_interval: int | None, grace: int | None) -> optuna.storages.RDBStorage:
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs["connect_args"] = {"timeout": 60}
    with warnings.catch_warnings():  # heartbeat_interval / grace_period are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=heartbeat_interval,
            grace_period=grace,
            # a trial whose worker died (stale heartbeat) is FAILED and re-enqueued, up to 3 times
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=3)
            if heartbeat_interval
            else None,
        )


def _create_sqlite(url: str) -> None:
    _rdb_storage(url, None, None).engine.dispose()


def make_storage(
    url: str, heartbeat_interval: int | None = None, grace: int | None = None
) -> optuna.storages.RDBStorage:
    """An RDB storage for ``url``; SQLite waits up to 60 s for a lock instead of failing at once, so
    a few local workers can share one file (use PostgreSQL for many workers or machines).

    A new SQLite file is made under a temporary name and linked into place once its tables exist
    (:func:`tuner.stores.create_sqlite_atomically`), so Ctrl-C never leaves a half-made store. Errors
    are one line with the URL's password masked."""
    for attempt in range(3):
        try:
            path = sqlite_path(url)
            if path is not None:
                create_sqlite_atomically(path, _create_sqlite)
            return _rdb_storage(url, heartbeat_interval, grace)
        except Exception as exc:  # SQLAlchemy/driver errors of many types: one clear line instead
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            # two workers creating the schema at once: the loser sees the winner's tables on retry
            if ("IntegrityError" in first or "already exists" in first) and attempt < 2:
                time.sleep(1.0 + attempt)
                continue
            raise ValueError(f"cannot open Optuna storage {redact_text(url)}: {redact_text(first)}") from None
    raise AssertionError("unreachable")


def open_study(
    settings: SearchSettings, num_layers: int, storage: optuna.storages.BaseStorage
) -> optuna.Study:
    """Create or load the study; a study made with other settings is an error, not silently mixed."""
    study = optuna.create_study(
        study_name=settings.name,
        storage=storage,
        directions=["maximize", "minimize"],
        sampler=make_sampler(settings.sampler, settings.seed, settings.n_trials),
        load_if_exists=True,
    )
    identity = settings.study_identity()
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
        study.set_user_attr("num_layers", num_layers)
        study.set_user_attr("lazyllm_version", lazyllm.__version__)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["speedup", "accuracy_loss"])  # MLflow and pareto.json names
    elif stored != identity:
        diff = {k: (stored.get(k), v) for k, v in identity.items() if stored.get(k) != v}
        raise ValueError(
            f"study {settings.name!r} in {redact_text(settings.storage_url)} was made with other settings {diff} "
            "(stored, given); use another --study-name or the same settings"
        )
    return study


def warm_start(study: optuna.Study, space: SearchSpace, num_layers: int) -> None:
    """Enqueue keep-all and a paper-style schedule, once per study."""
    if study.user_attrs.get("warm_started"):
        return
    for params in space.warm_start(num_layers):
        study.enqueue_trial(params, skip_if_exists=True)
    study.set_user_attr("warm_started", True)


def finished_trials(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def schedule_of(trial: FrozenTrial, model: str) -> Schedule:
    """The schedule a finished trial evaluated (from its user attrs)."""
    revival = Revival.parse(str(trial.user_attrs.get("revival", "dynamic")))  # studies before v2: dynamic
    return Schedule(model=model, percentiles=tuple(trial.user_attrs["percentiles"]), revival=revival)


def _non_dominated(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials no other trial beats on both objectives (speedup up, loss down), fastest first."""
    front = [
        t
        for t in trials
        if not any(
            o.values[0] >= t.values[0] and o.values[1] <= t.values[1] and tuple(o.values) != tuple(t.values)
            for o in trials
        )
    ]
    return sorted(front, key=lambda t: (-t.values[0], t.values[1], t.number))


def pareto_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Non-dominated complete trials (speedup up, loss down), sorted by speedup descending."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
    return _non_dominated(trials)


def feasible(trial: FrozenTrial, max_accuracy_loss: float) -> bool:
    """Within budget: every stored constraint <= 0 (the loss's one-sided upper bound within the
    study's budget); a trial without constraints falls back to its loss value against ``max_accuracy_loss``."""
    if trial.constraints:
        return all(c <= 0 for c in trial.constraints.values())
    return bool(trial.values) and trial.values[1] <= max_accuracy_loss


def feasible_front(study: optuna.Study, max_accuracy_loss: float) -> list[FrozenTrial]:
    """Non-dominated trials among the feasible ones, fastest first."""
    ok = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values and feasible(t, max_accuracy_loss) and "duplicate_of" not in t.user_attrs
    ]
    return _non_dominated(ok)


CONFIRMATION_ATTR = "confirmation"
"""Study user attr holding the confirmation stage's outcome (:mod:`tuner.confirm`)."""


def recommended_trial(study: optuna.Study, max_accuracy_loss: float) -> FrozenTrial | None:
    """The trial a user is told to use: the confirmed one once the confirmation stage has run on the
    study's current trials (None if it confirmed none); before that, the fastest complete feasible
    trial. Plots, ``pareto.json``, MLflow and the registry all read this, so they agree with
    ``recommended.json``."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    confirmation = study.user_attrs.get(CONFIRMATION_ATTR)
    if isinstance(confirmation, dict) and confirmation.get("complete_trials") == len(complete):
        number = confirmation.get("recommended_trial")
        return None if number is None else study.trials[int(number)]
    ok = [t for t in complete if t.values and feasible(t, max_accuracy_loss)]
    return max(ok, key=lambda t: (t.values[0], -t.values[1], -t.number), default=None)
