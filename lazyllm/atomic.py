"""Atomic file writes that several processes may make at once.

A fixed temporary name (``path + ".tmp"``) breaks as soon as two workers save the same file: one
truncates the other's half-written temporary, or renames it away first and the other's rename fails.
Each write here gets its own temporary beside the target (same folder, so the rename is atomic), and
the last complete write wins.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def unique_temporary(path: Path, suffix: str = ".tmp") -> Path:
    """A new, empty, hidden file beside ``path`` that no other writer can be handed."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    return Path(name)


def replace_with(path: str | Path, fill: Callable[[Path], object], suffix: str = ".tmp") -> Path:
    """Let ``fill`` write a unique temporary beside ``path``, then move it over ``path`` in one step.

    The temporary is removed when ``fill`` fails, so an error leaves the old file as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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
