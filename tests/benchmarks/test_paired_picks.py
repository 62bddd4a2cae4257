"""benchmarks/paired_picks.py: pairwise paired differences of tuner.evaluate runs, with the product's
estimator; runs on different examples are refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.support import load_benchmark
from tuner.evaluation.runner import ExampleResult, loss_estimate


def _rows(scores: list[float]) -> list[ExampleResult]:
    return [
        ExampleResult(f"d{i % 2}", f"q{i}", "lazyllm", "", s, 0.1, 0.2, 100, 4, 0.5)
        for i, s in enumerate(scores)
    ]


def _write(path: Path, rows: list[ExampleResult]) -> Path:
    path.write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in rows))
    return path


def test_pairs_are_paired_losses_with_the_products_estimator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("paired_picks")
    good = _rows([0.5, 0.4, 0.6, 0.5] * 5)
    worse = [dataclasses.replace(r, score=r.score - 0.1) for r in good]  # 10 points lower everywhere
    noisy = [dataclasses.replace(r, score=r.score + (0.05 if i % 2 else -0.05)) for i, r in enumerate(good)]
    diffs = bench.compare([("good", good), ("worse", worse), ("noisy", noisy)])
    assert [(d.first, d.second) for d in diffs] == [("good", "worse"), ("good", "noisy"), ("worse", "noisy")]
    assert diffs[0].diff.value == pytest.approx(-10.0) and diffs[0].apart  # good loses 10 points less
    assert diffs[0].diff == loss_estimate(
        good, worse
    )  # the product's estimator, worse in the baseline's place
    assert diffs[1].diff.value == pytest.approx(0.0, abs=1e-9)
    assert (
        bench.main([f"a={_write(tmp_path / 'a.jsonl', good)}", f"b={_write(tmp_path / 'b.jsonl', worse)}"])
        == 0
    )
    assert "a - b: -10.00 score points" in capsys.readouterr().out


def test_runs_on_other_examples_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("paired_picks")
    a = _write(tmp_path / "a.jsonl", _rows([0.5] * 4))
    b = _write(tmp_path / "b.jsonl", _rows([0.5] * 6))
    assert bench.main([f"a={a}", f"b={b}"]) == 2
    assert "different examples" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main([f"a={a}"])
