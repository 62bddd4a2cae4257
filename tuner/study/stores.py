"""The study's two databases (the Optuna storage and the MLflow tracking store): checked before
anything is written, and created so that an interrupt can never leave a half-made store behind.

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

import os
import re
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from lazyllm.atomic import process_alive
from tuner.redact import redact_text

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
