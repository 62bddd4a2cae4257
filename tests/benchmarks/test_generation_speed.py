"""benchmarks/generation_speed.py on a tiny random model: a row per method (against transformers) and per
(schedule, decoding) with ``--decoding``, speedups positive, keep-all's tokens equal transformers'."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import load_benchmark, longbench_dir

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("LONGBENCH_DIR", longbench_dir())
    return load_benchmark("generation_speed")


def test_methods_against_transformers(bench: ModuleType, deep_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "gen.json"
    argv = ["--model", str(deep_folder), "--tokens", "32", "--new-tokens", "3", "--rounds", "2",
            "--policies", "frozen", "--only", "keep-all engine", "progressive-30% frozen", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text())
    assert [r["method"] for r in rows] == ["unpruned", "keep-all engine", "progressive-30% frozen"]
    for r in rows:
        assert (r["new_tokens"], r["rounds"]) == (3, 2)
        for key in ("ttft_speedup", "total_speedup"):
            low, high = r[f"{key}_range"]
            assert 0 < low <= r[key] <= high
        assert r["decode_ms_per_token"] > 0 and 0 < r["prompt_computed_pct"] <= 100
    unpruned, keep_all, pruned = rows
    assert unpruned["ttft_speedup"] == 1.0 and unpruned["same_tokens_as_unpruned"]
    assert keep_all["same_tokens_as_unpruned"] and keep_all["prompt_computed_pct"] == 100.0
    assert pruned["prompt_computed_pct"] < 100.0  # the schedule prunes the 32-token prompt


def test_decoding_strategies_side_by_side(bench: ModuleType, deep_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "decoding.json"
    argv = ["--model", str(deep_folder), "--tokens", "32", "--new-tokens", "3", "--rounds", "1",
            "--decoding", "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = json.loads(out.read_text())
    assert [(r["schedule"], r["decoding"]) for r in rows] == [
        (s, d) for s in ("keep-all", "progressive-30% frozen") for d in ("greedy", "sampling", "streaming")
    ]
    for r in rows:
        assert r["ttft_s"] > 0 and r["decode_ms_per_token"] > 0
        assert r["ttft_ratio_range"][0] <= r["ttft_ratio_to_greedy"] <= r["ttft_ratio_range"][1]
    assert all(r["ttft_ratio_to_greedy"] == 1.0 for r in rows if r["decoding"] == "greedy")
    assert [r["prompt_computed_pct"] < 100.0 for r in rows] == [False] * 3 + [True] * 3
