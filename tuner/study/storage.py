"""Where a study lives: its Optuna storage (SQLite or a server), the local lock, the study's identity
(a study made with other settings is an error, never silently mixed) and its warm-start queue.

Resume: the same study name and storage continue the study until it holds ``n_trials`` finished
(COMPLETE or PRUNED) trials.
"""

from __future__ import annotations

import fcntl
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

import lazyllm
from lazyllm.atomic import remove_dead_temporaries
from tuner.redact import redact_text
from tuner.study.identity import StudyIdentity
from tuner.study.samplers import make_sampler
from tuner.study.settings import SearchSettings
from tuner.study.spaces import SearchSpace
from tuner.study.spaces.base import KEEP_ALL_ATTR
from tuner.study.stores import create_sqlite_atomically, sqlite_path
from tuner.study.workers import counts_towards_target

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


@contextmanager
def study_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder/.lock`` (POSIX ``flock``) for this machine's workers; once held,
    the temporaries that killed writers left in the folder are removed
    (:func:`lazyllm.atomic.remove_dead_temporaries`)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            remove_dead_temporaries(folder)
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
    (:func:`tuner.study.stores.create_sqlite_atomically`), so Ctrl-C never leaves a half-made store. Errors
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
    elif (
        then := StudyIdentity.from_dict(stored).to_dict()
    ) != identity:  # fields added since: their old meaning
        diff = {k: (then.get(k), v) for k, v in identity.items() if then.get(k) != v}
        raise ValueError(
            f"study {settings.name!r} in {redact_text(settings.storage_url)} was made with other settings {diff} "
            "(stored, given); use another --study-name or the same settings"
        )
    return study


def warm_start(study: optuna.Study, space: SearchSpace, num_layers: int) -> None:
    """Enqueue the reference trial (keep-all, user attr :data:`KEEP_ALL_ATTR`, no parameters: the
    sampler never models it), then the space's warm starts (paper-style first), once per study."""
    if study.user_attrs.get("warm_started"):
        return
    study.enqueue_trial({}, user_attrs={KEEP_ALL_ATTR: True})
    for params in space.warm_start(num_layers):
        study.enqueue_trial(params, skip_if_exists=True)
    study.set_user_attr("warm_started", True)


def finished_trials(study: optuna.Study) -> int:
    """The trials ``n_trials`` counts (refused duplicates are not among them)."""
    return sum(counts_towards_target(t) for t in study.get_trials(deepcopy=False, states=FINISHED))
