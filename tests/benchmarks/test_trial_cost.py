"""benchmarks/trial_cost.py on a tiny random model: one table row per schedule, the three forced paths
timed and their KLs equal up to float rounding; caches under ``--cache``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import load_benchmark, longbench_dir

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_three_paths_agree_on_every_schedule(
    deep_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("trial_cost")
    cache = tmp_path / "cache"
    argv = ["--model", str(deep_folder), "--max-prompt-tokens", "64", "--n-examples", "1", "--max-new-tokens", "4",
            "--data-dir", longbench_dir(), "--cache", str(cache)]  # fmt: skip
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r": [1-9]\d* examples, 64-token prompts", out)
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and "x |" in line]
    assert [r[0].strip() for r in rows] == list(bench.grid("m", 8))
    for name, speed, steps, one, prefix, _ratios, diff in rows:
        assert float(speed.strip().rstrip("x")) >= 1.0
        assert all(float(s) >= 0 for s in (steps, one, prefix))
        assert float(diff) < 1e-4, name  # the one pass (and resumed) KLs are the step-by-step ones
    assert any(cache.iterdir())  # baseline and reference cached where --cache says
