"""Append-only JSONL rows that a long recorder writes one at a time and resumes from.

A recorder (``benchmarks/record_grid.py``, ``benchmarks/kvpress_table.py``) appends one JSON object
per line as each measurement finishes, so a run stopped at any moment keeps everything before it. A
run killed while writing leaves at most a torn last line: :func:`read_rows` cuts it off the file, and
the rerun measures that row again. A bad line anywhere else is not a torn write but a damaged file,
and stops the recorder rather than being skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path`` (none when it does not exist); a torn last line is cut off the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    rows: list[dict[str, Any]] = []
    good = 0
    for line in data.splitlines(keepends=True):
        try:
            row = json.loads(line)
            if not line.endswith(b"\n"):
                raise ValueError("no newline")
        except ValueError:
            if good + len(line) < len(data):
                raise SystemExit(
                    f"{path}: a bad line in the middle at byte {good}; fix or move the file"
                ) from None
            print(f"{path}: cutting a truncated last line ({len(line)} bytes)")
            with path.open("r+b") as f:
                f.truncate(good)
            break
        rows.append(row)
        good += len(line)
    return rows
