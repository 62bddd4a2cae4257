"""Atomic file writes that several processes may make at once.

A fixed temporary name (``path + ".tmp"``) breaks as soon as two workers save the same file: one
truncates the other's half-written temporary, or renames it away first and the other's rename fails.
Each write here gets its own temporary beside the target (same folder, so the rename is atomic), and
the last complete write wins.

A writer killed mid-write (SIGKILL skips every cleanup) leaves its temporary behind. Temporaries are
named so that a later run recognises them: ``.<target>.tmp-<host>-<pid>-<random><suffix>``; one
whose process on this host is gone is removed by the next write of the same target and by
:func:`remove_dead_temporaries` (which a run calls on its own folder at start). Temporaries of the
older naming (``.<target>.<random>.tmp``, no pid) are removed once an hour old.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

LEGACY_AGE_S = 3600.0
"""A temporary of the older naming (no pid) older than this is a dead writer's: no write takes an hour."""

_HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname()) or "host"
# .<target>.tmp-<host>-<pid>-<8 random characters of mkstemp><suffix>
_OURS = re.compile(r"\..+\.tmp-(?P<host>[A-Za-z0-9]+)-(?P<pid>\d+)-[A-Za-z0-9_]{8}(\.[A-Za-z0-9]+)?")
_LEGACY = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.(tmp|png)")


def _prefix(path: Path) -> str:
    return f".{path.name}.tmp-{_HOST}-{os.getpid()}-"


def unique_temporary(path: Path, suffix: str = ".tmp") -> Path:
    """A new, empty, hidden file beside ``path`` that no other writer can be handed."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=_prefix(path), suffix=suffix)
    os.close(fd)
    return Path(name)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (this process always does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def is_dead_temporary(path: Path, *, now: float | None = None) -> bool:
    """``path`` is a temporary of this module whose writer is gone (this host's process no longer
    runs, or a pid-less older-style name an hour old)."""
    ours = _OURS.fullmatch(path.name)
    if ours is not None:
        return ours["host"] == _HOST and not process_alive(int(ours["pid"]))
    if _LEGACY.fullmatch(path.name) is not None:
        with contextlib.suppress(OSError):
            return (now if now is not None else time.time()) - path.stat().st_mtime > LEGACY_AGE_S
    return False


def remove_dead_temporaries(folder: str | Path, *, recursive: bool = True) -> list[Path]:
    """Remove the temporaries dead writers left in ``folder`` (and below it); returns them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    now = time.time()
    for candidate in folder.rglob(".*") if recursive else folder.glob(".*"):
        if candidate.is_file() and is_dead_temporary(candidate, now=now):
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()
                removed.append(candidate)
    return removed


def _remove_dead_siblings(path: Path) -> None:
    for candidate in path.parent.glob(f".{_glob_escape(path.name)}.*"):
        if is_dead_temporary(candidate):
            with contextlib.suppress(FileNotFoundError):
                candidate.unlink()


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def replace_with(path: str | Path, fill: Callable[[Path], object], suffix: str = ".tmp") -> Path:
    """Let ``fill`` write a unique temporary beside ``path``, then move it over ``path`` in one step.

    The temporary is removed when ``fill`` fails, so an error leaves the old file as it was; the
    temporaries of dead earlier writers of ``path`` are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_siblings(path)
    tmp = unique_temporary(path, suffix)
    try:
        fill(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """``data`` at ``path``, never half-written, whoever else writes it at the same time."""
    if isinstance(data, bytes):
        return replace_with(path, lambda tmp: tmp.write_bytes(data))
    return replace_with(path, lambda tmp: tmp.write_text(data))
