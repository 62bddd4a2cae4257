"""benchmarks/timing_under_load.py on a tiny random model with one real hog process: a row per
(schedule, hog count, clock), each with its repeats' errors against the quiet reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_row_per_schedule_hog_count_and_clock(tiny_folder: Path, tmp_path: Path) -> None:
    bench = load_benchmark("timing_under_load")
    out = tmp_path / "load.json"
    argv = ["--model", str(tiny_folder), "--tokens", "48", "--rounds", "1", "--repeats", "2",
            "--hogs", "1", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text())
    assert [(r["hogs"], r["clock"]) for r in rows] == [(1, "cpu"), (1, "wall")] * 3
    assert len({r["schedule"] for r in rows}) == 3
    for r in rows:
        assert r["rounds"] == 1 and len(r["errors"]) == 2 and r["worst_error"] in r["errors"]
        assert r["quiet"] > 0 and r["flop"] > 1.0 and r["wall_s"] > 0
        assert all(e > -1.0 for e in r["errors"])  # a speedup is positive: error = speedup / quiet - 1
