"""One Optuna study: maximise TTFT speedup, minimise accuracy loss, over a search space of schedules.

* Objectives: ``(speedup, accuracy_loss)`` with ``directions=["maximize", "minimize"]``. Speedup is
  the median paired TTFT speedup on the validation examples (``speedup="measured"``) or the FLOP
  model's (``"flops"``, deterministic; measured TTFT is still recorded). Accuracy loss is the baseline
  score minus the schedule's, LongBench metric, macro-averaged over the task's datasets.
* ``max_accuracy_loss`` is an Optuna constraint (``trial.set_constraint``; feasible when loss <= budget).
  A trial stops early, as PRUNED with the reason in its user attrs, once its loss cannot meet the
  budget even if every remaining example scored perfectly.
* Warm start: keep-all and a paper-style progressive schedule are enqueued when the study is new.
* Resume: the same study name and storage continue the study until it holds ``n_trials`` finished
  trials; the baseline comes from the on-disk cache.
"""

from __future__ import annotations

import fcntl
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
from lazyllm.schedule import Schedule
from tuner.evaluation import Evaluator, ExampleResult, summarize
from tuner.redact import redact_text
from tuner.samplers import make_sampler
from tuner.settings import SearchSettings
from tuner.spaces import SearchSpace
from tuner.stores import create_sqlite_atomically, sqlite_path
from tuner.workers import SurplusTrial, is_surplus

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


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


@dataclass
class StudyRunner:
    """Runs the trials of one study (one per process; no state shared between trials but the cache).

    Cheap to build: the baseline is computed (or read from its cache) beforehand and passed in.
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
        self.prompt_tokens = round(statistics.fmean(len(e.input_ids) for e in self.evaluator.examples))

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

    @staticmethod
    def _same_schedule(study: optuna.Study, schedule: Schedule) -> FrozenTrial | None:
        """A complete trial of ``study`` that evaluated exactly ``schedule``, if any."""
        wanted = list(schedule.percentiles)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.values and t.user_attrs.get("percentiles") == wanted:
                return t
        return None

    def objective(self, trial: optuna.Trial) -> tuple[float, float]:
        if is_surplus(trial.study, trial.number, self.settings.n_trials):
            trial.set_user_attr("surplus", True)
            raise SurplusTrial(f"trial {trial.number}: the study already has {self.settings.n_trials} trials")
        start = time.perf_counter()
        schedule = self.space.suggest(trial, self.settings.model, self.num_layers)
        flops = flop_speedup(schedule, self.dims, self.prompt_tokens)
        trial.set_user_attr("percentiles", list(schedule.percentiles))
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
        results, reason = self.evaluator.evaluate(
            "lazyllm",
            engine,
            paired_timing=self.settings.speedup == "measured",
            should_stop=self.early_stop,
            desc=f"trial {trial.number}",
        )
        trial.set_user_attr("wall_time_s", time.perf_counter() - start)
        trial.set_user_attr("examples_run", len(results))
        if reason:
            trial.set_user_attr("stopped_early", reason)
            raise optuna.TrialPruned(reason)
        summary = summarize(results, self.baseline.results)
        loss = float(summary["accuracy_loss"])
        measured = float(summary["ttft_speedup"])
        trial.set_user_attr("measured_ttft_speedup", measured)
        trial.set_user_attr("total_speedup", float(summary["total_speedup"]))
        trial.set_user_attr("prompt_computed_pct", float(summary["prompt_computed_pct"]))
        trial.set_user_attr("score", float(summary["score"]))
        trial.set_user_attr("baseline_score", float(summary["baseline_score"]))
        trial.set_user_attr("dataset_scores", summary["dataset_scores"])
        trial.set_constraint("accuracy_loss", loss - self.settings.max_accuracy_loss)  # read by the samplers
        speedup = measured if self.settings.speedup == "measured" else flops
        return speedup, loss


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
) -> optuna.storages.BaseStorage:
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


def open_study(settings: SearchSettings, num_layers: int) -> optuna.Study:
    """Create or load the study; a study made with other settings is an error, not silently mixed."""
    study = optuna.create_study(
        study_name=settings.name,
        storage=make_storage(settings.storage_url, settings.heartbeat_interval, settings.heartbeat_grace),
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
    return Schedule(model=model, percentiles=tuple(trial.user_attrs["percentiles"]))


def pareto_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Non-dominated complete trials (speedup up, loss down), sorted by speedup descending."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
    front = [
        t
        for t in trials
        if not any(
            o.values[0] >= t.values[0] and o.values[1] <= t.values[1] and tuple(o.values) != tuple(t.values)
            for o in trials
        )
    ]
    return sorted(front, key=lambda t: (-t.values[0], t.values[1], t.number))


def recommended_trial(study: optuna.Study, max_accuracy_loss: float) -> FrozenTrial | None:
    """The fastest complete trial whose accuracy loss is within the budget."""
    ok = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values and t.values[1] <= max_accuracy_loss
    ]
    return max(ok, key=lambda t: (t.values[0], -t.values[1], -t.number), default=None)
