"""benchmarks/prefill_speed.py on a tiny random model: a row per (length, dtype) with keep-all's overhead
and every schedule's realized and FLOP-model speedups, and with two dtypes the second over the first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_row_per_length_and_dtype(deep_folder: Path, tmp_path: Path) -> None:
    bench = load_benchmark("prefill_speed")
    out = tmp_path / "prefill.json"
    argv = ["--model", str(deep_folder), "--lengths", "24", "40", "--rounds", "2",
            "--dtypes", "float32", "bfloat16", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text())
    timed = [r for r in rows if "dtype" in r]
    assert [(r["tokens"], r["dtype"]) for r in timed] == [
        (n, d) for n in (24, 40) for d in ("float32", "bfloat16")
    ]
    names = set(bench.schedules("x", 12))
    for r in timed:
        assert r["rounds"] == 2 and r["transformers_s"] > 0
        assert r["keep_all_overhead"] > 0 and r["keep_all_overhead_median"] > 0
        assert names <= set(r)
        for name in names:
            s = r[name]
            assert s["realized"] > 0 and s["realized_median"] > 0
            assert s["flop_model"] > 1.0 and 0 < s["computed_pct"] < 100
    cross = [r for r in rows if "speedup_of" in r]
    assert [(r["tokens"], r["speedup_of"], r["over"]) for r in cross] == [
        (24, "bfloat16", "float32"),
        (40, "bfloat16", "float32"),
    ]
    assert all(set(r[k]) == {"min", "median"} for r in cross for k in ("transformers", "keep-all", *names))
