"""benchmarks/batch_throughput.py on a tiny random model: one row per (side, batch size) with positive
throughput, keep-all's greedy tokens equal transformers' row by row, written where ``--out`` says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark, longbench_dir

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_side_and_batch_size_gets_a_row(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LONGBENCH_DIR", longbench_dir())
    bench = load_benchmark("batch_throughput")
    out = tmp_path / "throughput.json"
    argv = ["--model", str(tiny_folder), "--batch-sizes", "1", "2", "--prompt-tokens", "32",
            "--new-tokens", "2", "--rounds", "2", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["settings"]["model"] == str(tiny_folder) and data["schedule"]["percentiles"]
    rows = data["rows"]
    assert [(r["side"], r["batch_size"]) for r in rows] == [
        (side, b) for b in (1, 2) for side in ("transformers", "keep-all", "schedule")
    ]
    for r in rows:
        assert r["tokens_per_s_min"] <= r["tokens_per_s"] <= r["tokens_per_s_max"] and r["tokens_per_s"] > 0
        assert r["speed_vs_transformers_min"] <= r["speed_vs_transformers"] <= r["speed_vs_transformers_max"]
        assert (r["new_tokens"], r["prompt_tokens_max"], r["rounds"]) == (2, 32, 2)
    assert all(r["speed_vs_transformers"] == 1.0 for r in rows if r["side"] == "transformers")
    # the engine with nothing pruned decodes what transformers decodes, padded batch included
    assert all(r["same_tokens_as_transformers"] for r in rows if r["side"] in ("transformers", "keep-all"))
