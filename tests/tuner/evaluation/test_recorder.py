"""tuner.evaluation.recorder: a recorder's append-only JSONL survives a kill mid-write, never a damaged file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.evaluation.recorder import read_rows


def test_a_torn_last_line_is_cut_off_and_the_rest_kept(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    assert read_rows(path) == []  # no file yet: nothing done
    rows = [{"m": "a", "x": 1}, {"m": "b", "x": 2}]
    whole = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(whole + '{"m": "c", "x"')  # killed while writing the third row
    assert read_rows(path) == rows
    assert path.read_text() == whole  # the torn bytes are gone: the next append starts a clean line
    path.write_text(whole + json.dumps({"m": "c"}))  # whole JSON without its newline is torn too
    assert read_rows(path) == rows and path.read_text() == whole


def test_a_bad_line_in_the_middle_stops_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    text = '{"m": "a"}\nnot json\n{"m": "b"}\n'
    path.write_text(text)
    with pytest.raises(SystemExit, match="a bad line in the middle at byte 11"):
        read_rows(path)
    assert path.read_text() == text
