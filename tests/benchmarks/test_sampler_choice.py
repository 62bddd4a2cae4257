"""benchmarks/sampler_choice.py on a tiny random model: every (sampler, seed) runs its own study through
the product's trial runner; the table ranks the samplers by hypervolume; the baseline is cached
under ``--cache``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import load_benchmark, longbench_dir

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_hypervolume_per_sampler_and_seed(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("sampler_choice")
    cache = tmp_path / "cache"
    argv = ["--model", str(tiny_folder), "--trials", "2", "--seeds", "0", "1", "--samplers", "random", "tpe",
            "--budget", "50", "--data-dir", longbench_dir(), "--cache", str(cache)]  # fmt: skip
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    runs = re.findall(r"^(\w+) +seed (\d): hypervolume ([\d.]+) \((\d+) complete trials\)$", out, re.M)
    assert [(name, int(seed)) for name, seed, _, _ in runs] == [
        ("random", 0),
        ("random", 1),
        ("tpe", 0),
        ("tpe", 1),
    ]
    assert all(float(hv) >= 0 and 1 <= int(n) <= 2 for _, _, hv, n in runs)
    table = re.findall(r"^\| (\w+) \| ([\d.]+) \+- ([\d.]+) \|$", out, re.M)
    assert sorted(name for name, _, _ in table) == ["random", "tpe"]
    means = [float(mean) for _, mean, _ in table]
    assert means == sorted(means, reverse=True)  # best first
    assert any(cache.iterdir())


def test_hypervolume_counts_only_what_beats_the_reference() -> None:
    bench = load_benchmark("sampler_choice")
    assert bench.hypervolume([], 1.0, 2.0) == 0.0
    assert bench.hypervolume([(0.9, 0.0), (2.0, 3.0)], 1.0, 2.0) == 0.0  # slower, or over budget
    assert bench.hypervolume([(2.0, 1.0)], 1.0, 2.0) == pytest.approx(1.0)
    # a dominated point adds nothing; a second front point adds its own strip
    assert bench.hypervolume([(2.0, 1.0), (1.5, 1.5)], 1.0, 2.0) == pytest.approx(1.0)
    assert bench.hypervolume([(2.0, 1.0), (1.5, 0.0)], 1.0, 2.0) == pytest.approx(1.0 + 0.5)
