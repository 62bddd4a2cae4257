"""Running a study's trials in one or many workers that share one Optuna storage.

A worker runs trials one at a time until the study holds ``n_trials`` finished (COMPLETE or PRUNED)
trials, so the same command on several machines, ``--n-workers K`` on one machine, or a rerun after a
crash all end at the same count:

* Every trial's first step checks its place: a trial whose number comes after ``n_trials``
  live (not failed) trials is *surplus* (two workers asked at once for the last slot); it is
  marked FAILED with user attr ``surplus`` and never evaluated, so the study never runs more.
* While the remaining slots are all held by running trials, a worker waits instead of starting more;
  if one of them belonged to a dead worker, its heartbeat goes stale, ``fail_stale_trials`` marks it
  FAILED and ``RetryHeartbeatStaleTrialCallback`` enqueues a copy, which the next free worker runs.
  A worker killed between Optuna creating its trial and the trial's first heartbeat leaves a RUNNING
  trial with no heartbeat at all, which Optuna's stale check never fails: :class:`HeartbeatlessTrials`
  gives such a trial one heartbeat, so it goes stale and is retried like the others (without it, every
  later run waited for that trial forever).
* ``--n-workers K`` starts K local processes (joblib, loky backend), each loading the model once; on
  CUDA worker ``i`` takes GPU ``i % n_gpus``, on CPU the cores are split between workers. The baseline
  is computed once by the parent before the workers start; they read it from the on-disk cache.
* Ctrl-C during a trial: the trial is marked FAILED with user attr ``interrupted``, a copy with the
  same parameters is enqueued (as ``RetryHeartbeatStaleTrialCallback`` does for a dead worker's
  trial, so a queued warm-start schedule is never lost), the callbacks see the failed trial (its
  MLflow run), and the ``KeyboardInterrupt`` goes on to the CLI, which prints how to resume.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.study.settings import SearchSettings

_LIVE = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
MAX_CONSECUTIVE_FAILURES = 3


class SurplusTrial(Exception):
    """The study already has ``n_trials`` live trials before this one."""


class DuplicateSchedule(optuna.TrialPruned):
    """The trial proposed a schedule the study already holds: it ends PRUNED (a refusal, not a
    failure, in every view of the study) with system attr :data:`DUPLICATE_ATTR`, and is not counted
    towards ``n_trials``. Pruned, it also sits in the sampler's "worse" group, so TPE moves away from
    proposing the same schedule again."""


DUPLICATE_ATTR = "duplicate_of"
"""System attr of a refused duplicate proposal: the trial number that holds that schedule."""


def is_duplicate(trial: FrozenTrial) -> bool:
    """A proposal refused as a duplicate (PRUNED now; FAILED in studies made before)."""
    return trial.system_attrs.get(DUPLICATE_ATTR) is not None


def counts_towards_target(trial: FrozenTrial) -> bool:
    """A finished trial that evaluated a schedule (COMPLETE, or PRUNED early): what ``n_trials`` counts."""
    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) and not is_duplicate(trial)


MAX_CONSECUTIVE_DUPLICATES = 50
"""Refused duplicate proposals in a row after which the space counts as exhausted."""


def never_ran(trial: FrozenTrial) -> bool:
    """A trial that evaluated nothing: surplus (one too many) or a refused duplicate."""
    return bool(trial.user_attrs.get("surplus")) or is_duplicate(trial)


def is_surplus(study: optuna.Study, number: int, target: int) -> bool:
    """Whether ``target`` live trials with smaller numbers exist (this trial would be one too many)."""
    live = study.get_trials(deepcopy=False, states=_LIVE)
    return sum(1 for t in live if t.number < number and not is_duplicate(t)) >= target


def counts(study: optuna.Study) -> dict[TrialState, int]:
    out = dict.fromkeys(TrialState, 0)
    for t in study.get_trials(deepcopy=False):
        out[t.state] += 1
    return out


@contextmanager
def _no_second_interrupt() -> Iterator[None]:
    """Ignore Ctrl-C while an interrupt is being recorded (a second press must not lose the retry)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def retry_copy(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue a WAITING copy of ``trial`` with its parameters (and fixed warm-start parameters)."""
    system_attrs: dict[str, Any] = {"failed_trial": trial.number, "retry_history": [], **trial.system_attrs}
    system_attrs["retry_history"] = [*system_attrs["retry_history"], trial.number]
    user_attrs = {k: v for k, v in trial.user_attrs.items() if k != "interrupted"}
    study.add_trial(
        optuna.create_trial(
            state=TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs=user_attrs,
            system_attrs=system_attrs,
        )
    )


def record_interrupt(study: optuna.Study, trial_id: int, callbacks: list[Any]) -> None:
    """The trial ``trial_id`` was interrupted: FAILED (``interrupted``), retried, shown to ``callbacks``."""
    storage = study._storage
    trial = storage.get_trial(trial_id)
    if trial.state not in (TrialState.RUNNING, TrialState.FAIL) or trial.user_attrs.get("surplus"):
        return  # it finished before the interrupt, or never needed to run
    if trial.state == TrialState.RUNNING:  # the interrupt landed inside Optuna, around the objective
        storage.set_trial_user_attr(trial_id, "interrupted", True)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    trial = storage.get_trial(trial_id)
    retry_copy(study, trial)
    for callback in callbacks:  # e.g. the FAILED MLflow run of the trial
        try:
            callback(study, trial)
        except Exception as exc:  # never hide the interrupt behind a logging problem
            print(f"after the interrupt, {type(callback).__name__} failed: {exc}")


class HeartbeatlessTrials:
    """RUNNING trials that may never have recorded a heartbeat, made visible to the stale check.

    Optuna records a trial's first heartbeat from a thread it starts after creating the trial; a
    worker killed in between leaves the trial RUNNING with no heartbeat row, and ``fail_stale_trials``
    only looks at trials that have one. A trial this process has watched RUNNING for longer than the
    grace period without ``fail_stale_trials`` failing it is either alive (beating) or heartbeatless.
    It gets one heartbeat on its behalf through the storage's public ``record_heartbeat``: harmless
    to a live trial, whose own thread goes on beating, and for a dead one the start of its grace
    period, after which it is failed and retried like any dead worker's trial. The cost: a trial
    whose worker dies *after* this process first saw it alive may be failed up to one grace period
    later than it would have been, once. Clocks: only this process's monotonic clock and the
    storage's own heartbeat time are compared, never two machines'.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s  # the storage's grace period (``--heartbeat-grace``)
        self.first_seen: dict[int, float] = {}
        self.beaten: set[int] = set()

    def check(self, study: optuna.Study, now: float) -> None:
        """Give a heartbeat to each trial watched RUNNING past the grace period (once per trial)."""
        storage: Any = study._storage  # Optuna wraps the RDB storage; both have the heartbeat methods
        if not getattr(storage, "get_heartbeat_interval", lambda: None)():
            return
        running = {t._trial_id for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
        self.first_seen = {tid: seen for tid, seen in self.first_seen.items() if tid in running}
        for tid in sorted(running):
            seen = self.first_seen.setdefault(tid, now)
            if tid not in self.beaten and now - seen > self.grace_s:
                storage.record_heartbeat(tid)
                self.beaten.add(tid)


class _QuietInterrupted(logging.Filter):
    """Drops Optuna's "Trial N failed ..." warnings (with the traceback) for trials cut by Ctrl-C:
    the CLI prints one line for those."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: set[int] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(f"Trial {n} failed with") for n in self.numbers)


def stop_orphaned_heartbeats() -> None:
    """Stop the Optuna heartbeat threads still beating in this process.

    Optuna runs each trial inside ``with get_heartbeat_thread(...)``: a non-daemon thread records the
    trial's heartbeat until the block's exit sets its stop event. A Ctrl-C that lands after the thread
    started but before the block's body (or inside its exit, before the event is set) skips that exit,
    and the interpreter then waits for the thread forever after the CLI's last line (a hang seen in
    the chaos test). Called once ``optimize`` has returned or raised, when no trial of this worker runs,
    so every heartbeat thread left is such an orphan. Optuna exposes no handle to it; the thread's stop
    event is found among the arguments it was started with."""
    from optuna.storages._heartbeat import HeartbeatThread

    beat = HeartbeatThread._record_heartbeat
    for thread in threading.enumerate():
        if getattr(thread, "_target", None) is beat:
            for arg in getattr(thread, "_args", ()):
                if isinstance(arg, threading.Event):
                    arg.set()


def interrupted_by_ctrl_c(exc: BaseException) -> bool:
    """A Ctrl-C, or an error raised while one was being handled: a SIGINT that lands inside Optuna's
    own bookkeeping of a trial (its ``tell``) surfaces as that code's ``UnboundLocalError``, with the
    ``KeyboardInterrupt`` as its context. Either way the run was interrupted, not broken."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: the interrupt is the error's context, or its context's
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__context__
    return False


@dataclass
class _Streaks:
    """Consecutive outcomes of this worker's trials: failures end the run with an error, refused
    duplicates with ``exhausted``."""

    failures: int = 0
    duplicates: int = 0

    def update(self, new: Sequence[FrozenTrial]) -> str | None:
        """Count the trials one ``optimize`` call left (``new``); the stop reason, if any."""
        failed = [t for t in new if t.state == TrialState.FAIL and not never_ran(t)]
        self.failures = self.failures + 1 if failed else 0
        self.duplicates = self.duplicates + 1 if any(is_duplicate(t) for t in new) else 0
        if self.duplicates >= MAX_CONSECUTIVE_DUPLICATES:
            return "exhausted"  # the sampler keeps proposing schedules the study already holds
        if self.failures >= MAX_CONSECUTIVE_FAILURES:
            raise ValueError(
                f"{self.failures} trials in a row failed (last: trial {failed[-1].number}); "
                "see the log above, fix the cause and rerun to resume"
            )
        return None


def _next_step(settings: SearchSettings, study: optuna.Study, elapsed: float) -> str:
    """``done``, ``timeout``, ``wait`` (the last slots are held by running trials) or ``run``."""
    c = counts(study)
    finished = sum(counts_towards_target(t) for t in study.get_trials(deepcopy=False))
    if finished >= settings.n_trials:
        return "done"
    if settings.trials_timeout is not None and elapsed > settings.trials_timeout:
        return "timeout"
    if finished + c[TrialState.RUNNING] >= settings.n_trials:
        # the last slots are held by running trials: wait for them (or their retries); a queued
        # trial (a warm start past n_trials) taken now would only be failed as surplus
        return "wait"
    return "run"


def _fail_dead_trials(study: optuna.Study, heartbeatless: HeartbeatlessTrials) -> None:
    """Dead workers' trials -> FAILED (retried via the callback), and those that died before their
    first heartbeat one grace period later."""
    with warnings.catch_warnings():  # fail_stale_trials is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    heartbeatless.check(study, time.monotonic())


def run_trials(
    settings: SearchSettings,
    study: optuna.Study,
    objective: Any,
    callbacks: list[Any],
    *,
    poll_s: float = 2.0,
) -> str:
    """Run trials here until the study is done; returns why it stopped ("done", "timeout", or
    "exhausted" when the space yields no new schedule)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.monotonic()
    streaks = _Streaks()
    current: list[int] = []  # the trial id this process is running
    quiet = _QuietInterrupted()
    heartbeatless = HeartbeatlessTrials(settings.heartbeat_grace)
    optimize_log = logging.getLogger("optuna.study._optimize")  # where Optuna logs failed trials

    def guarded(trial: optuna.Trial) -> Any:
        current[:] = [trial._trial_id]
        try:
            return objective(trial)
        except KeyboardInterrupt:
            quiet.numbers.add(trial.number)
            trial.set_user_attr("interrupted", True)
            raise
        except (SurplusTrial, DuplicateSchedule):
            quiet.numbers.add(trial.number)  # expected: the progress line says it, no traceback
            raise

    while True:
        _fail_dead_trials(study, heartbeatless)
        step = _next_step(settings, study, time.monotonic() - start)
        if step in ("done", "timeout"):
            return step
        if step == "wait":
            time.sleep(poll_s)  # wait for the running trials (or their retries)
            continue
        numbered = len(study.get_trials(deepcopy=False))
        current.clear()
        optimize_log.addFilter(quiet)
        try:
            study.optimize(
                guarded,
                n_trials=1,
                callbacks=callbacks,
                catch=(RuntimeError, SurplusTrial, DuplicateSchedule),
            )
        except BaseException as exc:
            stop_orphaned_heartbeats()  # else a Ctrl-C in Optuna's heartbeat setup hangs the exit
            if not interrupted_by_ctrl_c(exc):
                raise
            if current:
                with _no_second_interrupt():
                    record_interrupt(study, current[0], callbacks)
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise KeyboardInterrupt from exc
        finally:
            optimize_log.removeFilter(quiet)
        stop = streaks.update(study.get_trials(deepcopy=False)[numbered:])
        if stop is not None:
            return stop


def worker_threads(n_workers: int) -> int:
    """CPU threads per local worker: the machine's cores split evenly."""
    return max(1, (os.cpu_count() or 1) // n_workers)


def worker_device(worker_id: int) -> str | None:
    """GPU ``worker_id % n_gpus`` on a CUDA machine, else None (the default device)."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{worker_id % torch.cuda.device_count()}"
    return None
