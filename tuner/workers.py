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
* ``--n-workers K`` starts K local processes (joblib, loky backend), each loading the model once; on
  CUDA worker ``i`` takes GPU ``i % n_gpus``, on CPU the cores are split between workers. The baseline
  is computed once by the parent before the workers start; they read it from the on-disk cache.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.settings import SearchSettings

_LIVE = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
MAX_CONSECUTIVE_FAILURES = 3


class SurplusTrial(Exception):
    """The study already has ``n_trials`` live trials before this one."""


def is_surplus(study: optuna.Study, number: int, target: int) -> bool:
    """Whether ``target`` live trials with smaller numbers exist (this trial would be one too many)."""
    live = study.get_trials(deepcopy=False, states=_LIVE)
    return sum(1 for t in live if t.number < number) >= target


def counts(study: optuna.Study) -> dict[TrialState, int]:
    out = dict.fromkeys(TrialState, 0)
    for t in study.get_trials(deepcopy=False):
        out[t.state] += 1
    return out


def run_trials(
    settings: SearchSettings,
    study: optuna.Study,
    objective: Any,
    callbacks: list[Any],
    *,
    poll_s: float = 2.0,
) -> str:
    """Run trials here until the study is done; returns why it stopped ("done" or "timeout")."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.monotonic()
    failures = 0
    while True:
        with warnings.catch_warnings():  # fail_stale_trials is marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(
                study
            )  # dead workers' trials -> FAILED, retried via the callback
        c = counts(study)
        finished = c[TrialState.COMPLETE] + c[TrialState.PRUNED]
        if finished >= settings.n_trials:
            return "done"
        if settings.timeout is not None and time.monotonic() - start > settings.timeout:
            return "timeout"
        if finished + c[TrialState.RUNNING] >= settings.n_trials and not c[TrialState.WAITING]:
            time.sleep(poll_s)  # the last slots are held by running trials: wait for them (or their retries)
            continue
        before = len(study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))
        study.optimize(objective, n_trials=1, callbacks=callbacks, catch=(RuntimeError, SurplusTrial))
        failed = study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        new_failures = [t for t in failed[before:] if not t.user_attrs.get("surplus")]
        failures = failures + 1 if new_failures else 0
        if failures >= MAX_CONSECUTIVE_FAILURES:
            raise ValueError(
                f"{failures} trials in a row failed (last: trial {new_failures[-1].number}); "
                "see the log above, fix the cause and rerun to resume"
            )


def worker_threads(n_workers: int) -> int:
    """CPU threads per local worker: the machine's cores split evenly."""
    return max(1, (os.cpu_count() or 1) // n_workers)


def worker_device(worker_id: int) -> str | None:
    """GPU ``worker_id % n_gpus`` on a CUDA machine, else None (the default device)."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{worker_id % torch.cuda.device_count()}"
    return None
