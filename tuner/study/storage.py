"""Where a study lives: its Optuna storage (SQLite or a server) and its MLflow tracking store, the
local lock, the study's identity (a study made with other settings is an error, never silently
mixed) and its warm-start queue.

Resume: the same study name and storage continue the study until it holds ``n_trials`` finished
(COMPLETE or PRUNED) trials.

The two databases are checked before anything is written and created so that an interrupt can
never leave a half-made store behind:

* :func:`check_storage` / :func:`check_tracking_store` / :func:`check_database`: a SQLite URL must
  name a SQLite file (or nothing yet, in a folder that exists: a URL names an existing place, only
  the default study folder is made by the run), a server URL must name an installed driver and answer; every
  message has its password masked.
* :func:`create_sqlite_atomically`: a new SQLite store is built under a temporary name beside the
  final one and linked into place only once complete (``os.link`` never replaces a file another
  process made meanwhile). Ctrl-C while MLflow runs its schema migrations (the "Creating initial
  MLflow database tables..." step, several seconds) therefore leaves nothing the rerun trips on.
* :func:`prepare_mlflow_store`: creates the default MLflow SQLite store that way, and repairs a
  store an older version left half-migrated (an ``_alembic_tmp_*`` table and no runs): it is moved
  aside to ``<name>.broken`` and made again.
"""

from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

import lazyllm
from lazyllm.atomic import process_alive, remove_dead_temporaries
from tuner.redact import redact_text
from tuner.study.identity import StudyIdentity
from tuner.study.samplers import make_sampler
from tuner.study.settings import SearchSettings
from tuner.study.spaces import SearchSpace
from tuner.study.spaces.base import KEEP_ALL_ATTR
from tuner.study.workers import counts_towards_target

SQLITE_MAGIC = b"SQLite format 3\x00"


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///...`` URL (None for other URLs and in-memory databases)."""
    if not url.startswith("sqlite:"):
        return None
    rest = url[len("sqlite:") :]
    if not rest.startswith("///"):
        return None  # sqlite:// = in memory
    path = rest[3:].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def check_sqlite_file(path: Path, what: str, flag: str, *, folder: bool = True) -> None:
    """``path`` is an existing SQLite database, or nothing yet in an existing folder (that last part
    only with ``folder``: a URL the user gave names an existing place; only the run's own default
    folder is made by the run, so ``folder=False`` leaves it to the caller)."""
    if path.is_dir():
        raise ValueError(f"{what} {path} is a folder, not a SQLite file; pass another {flag}")
    if path.exists():
        try:
            with path.open("rb") as fh:
                head = fh.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise ValueError(f"cannot read {what} {path}: {exc.strerror}; pass another {flag}") from None
        if head and head != SQLITE_MAGIC:
            raise ValueError(f"{what} {path} is not a SQLite database; pass another {flag}")
        return
    if not folder:
        return
    parent = path.parent
    if not parent.exists():
        raise ValueError(
            f"{what} {path}: its folder {parent} does not exist; create it or pass another {flag}"
        )
    if not parent.is_dir():
        raise ValueError(f"cannot create {what} {path}: {parent} is not a folder; pass another {flag}")


def _first_line(exc: BaseException) -> str:
    return redact_text((str(exc).strip().splitlines() or [type(exc).__name__])[0])


def check_storage(url: str, *, folder: bool = True) -> None:
    """Fail fast (one line, password masked) when the Optuna storage cannot be used. Writes nothing.

    ``folder=False`` leaves a SQLite file's folder to the caller (the default storage lives in the
    output folder, whose own check says which flag to change)."""
    path = sqlite_path(url)
    if path is not None:
        check_sqlite_file(path, "Optuna storage", "--storage", folder=folder)
        return
    if url.startswith("sqlite:"):
        return  # in memory
    check_database(url, "Optuna storage", "--storage")


def check_database(url: str, what: str, flag: str, *, timeout_s: int = 10) -> None:
    """A server database URL (``postgresql+psycopg://...``, ``mysql://...``) names an installed
    driver and answers within ``timeout_s``; else one line (password masked) naming ``flag``."""
    import sqlalchemy

    shown = redact_text(url)
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception as exc:  # SQLAlchemy's ArgumentError and friends
        raise ValueError(
            f"{what} {shown} is not a database URL ({_first_line(exc)}); pass another {flag}"
        ) from None
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() in ("postgresql", "mysql"):
        connect_args["connect_timeout"] = timeout_s
    try:
        engine = sqlalchemy.create_engine(url, connect_args=connect_args)
    except ImportError as exc:
        raise ValueError(
            f"{what} {shown}: its database driver is not installed ({_first_line(exc)}); install it or name "
            f"an installed one in the scheme (e.g. postgresql+psycopg://), or pass another {flag}"
        ) from None
    except Exception as exc:
        raise ValueError(f"{what} {shown} is not usable: {_first_line(exc)}; pass another {flag}") from None
    try:
        with engine.connect():
            pass
    except Exception as exc:  # SQLAlchemy and driver errors of many types: one clear line instead
        raise ValueError(
            f"cannot reach {what} {shown}: {_first_line(exc)}; start the database or pass another {flag}"
        ) from None
    finally:
        engine.dispose()


def check_tracking_store(uri: str, *, folder: bool = True) -> None:
    """The SQLite part of the tracking check (servers: :func:`tuner.tracking.runs.check_reachable`)."""
    path = sqlite_path(uri)
    if path is not None:
        check_sqlite_file(path, "MLflow store", "--tracking-uri", folder=folder)


def _remove_dead_leftovers(path: Path) -> None:
    """Temporary stores of processes that died mid-creation (kill -9 skips their cleanup)."""
    pattern = re.compile(rf"{re.escape(path.name)}\.creating-(\d+)(-journal)?")
    for leftover in path.parent.glob(f"{path.name}.creating-*"):
        match = pattern.fullmatch(leftover.name)
        if match and int(match[1]) != os.getpid() and not process_alive(int(match[1])):
            leftover.unlink(missing_ok=True)


def create_sqlite_atomically(path: Path, build: Callable[[str], None]) -> bool:
    """Make the SQLite store ``path`` with ``build(url_of_a_temporary_file)`` unless it exists.

    Returns whether this call created it. The temporary file is removed whatever happens (an
    interrupt included); a store another process linked into place meanwhile is kept, not replaced.
    """
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_leftovers(path)
    tmp = path.with_name(f"{path.name}.creating-{os.getpid()}")
    try:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            leftover.unlink(missing_ok=True)
        build(f"sqlite:///{tmp.resolve()}")
        try:
            os.link(tmp, path)  # atomic, and never replaces a store made meanwhile
        except FileExistsError:
            return False
        return True
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
            leftover.unlink(missing_ok=True)


def _connect(path: Path) -> sqlite3.Connection:
    """An existing store opened read-write, never created: a process killed mid-write leaves a hot
    journal that SQLite rolls back on open, which a read-only connection cannot do."""
    return sqlite3.connect(f"file:{path}?mode=rw", uri=True)


def _tables(path: Path) -> set[str]:
    with closing(_connect(path)) as con:
        return {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _run_count(path: Path) -> int:
    with closing(_connect(path)) as con:
        return int(con.execute("SELECT count(*) FROM runs").fetchone()[0])


def _build_mlflow(path: Path) -> Callable[[str], None]:
    def build(url: str) -> None:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        artifacts = (path.parent / "mlartifacts").resolve().as_uri()
        store = SqlAlchemyStore(url, artifacts)  # runs MLflow's schema migrations
        store.engine.dispose()
        getattr(SqlAlchemyStore, "_engine_map", {}).pop(url, None)  # MLflow caches engines per URL

    return build


def prepare_mlflow_store(uri: str) -> None:
    """Create (atomically) or repair the SQLite MLflow store of ``uri``; other URIs are left alone."""
    path = sqlite_path(uri)
    if path is None:
        return
    if path.parent.is_dir():
        _remove_dead_leftovers(path)
    if path.exists() and path.stat().st_size > 0:
        tables = _tables(path)
        if not any(t.startswith("_alembic_tmp_") for t in tables):
            return
        if "runs" in tables and _run_count(path) > 0:
            raise ValueError(
                f"MLflow store {path} was left half-migrated (an interrupted upgrade) and holds runs; "
                "restore it from a backup or pass another --tracking-uri"
            )
        aside = path.with_name(path.name + ".broken")
        os.replace(path, aside)
        print(f"MLflow store {path} was left half-created by an interrupted run; moved it to {aside.name}")
    elif path.exists():
        path.unlink()  # an empty file: nothing to keep
    create_sqlite_atomically(path, _build_mlflow(path))


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
    (:func:`tuner.study.storage.create_sqlite_atomically`), so Ctrl-C never leaves a half-made store. Errors
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
