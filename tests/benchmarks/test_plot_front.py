"""benchmarks/plot_front.py: the README's picture is drawn from the run its table reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
SEED0 = ROOT / "benchmarks" / "data" / "longbench-qa-2026-12-04" / "seed0.pareto.json"


def test_the_front_is_drawn_with_the_recommended_trial_starred(tmp_path: Path) -> None:
    bench = load_benchmark("plot_front")
    rows = json.loads(SEED0.read_text())
    pick = next(r for r in rows if r["recommended"])
    assert pick["trial"] == 5  # the pick the README's results table reports
    fig = bench.front_figure(rows, "seed 0")
    (ax,) = fig.axes
    labels = ax.get_legend_handles_labels()[1]
    assert "recommended: trial 5" in labels
    stars = [c for c in ax.collections if c.get_label() == "recommended: trial 5"]
    assert [tuple(p) for p in stars[0].get_offsets()] == [(pick["speedup"], pick["accuracy_loss"])]
    line = ax.lines[0]  # the front, joined in order of speedup
    assert list(line.get_xdata()) == sorted(r["speedup"] for r in rows)
    assert "14 front schedules, 13 validation examples per point" in ax.get_title()
    out = tmp_path / "front.png"
    assert bench.main([str(SEED0), "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no trial"):
        bench.front_figure([], "empty")
