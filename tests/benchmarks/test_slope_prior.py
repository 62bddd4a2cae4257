"""benchmarks/slope_prior.py on the committed open-QA grid: it refits the packaged prior exactly (same
slope, same bounds at every level), writes where ``--out`` says, and refuses to write a package prior
on too few examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark
from tuner.statistics.prior import SlopePrior

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "benchmarks" / "data" / "grid-smollm2-135m-openqa-validation-1024.jsonl"
PACKAGED = ROOT / "tuner" / "statistics" / "priors" / "smollm2-135m-1024.json"


def test_the_packaged_prior_is_refitted_from_its_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("slope_prior")
    packaged = json.loads(PACKAGED.read_text())
    out = tmp_path / "prior.json"
    argv = ["--rows", str(ROWS), "--power", str(ROOT / "benchmarks" / "data" / "decision_rule.openqa.json"),
            "--scaling", packaged["scaling"], "--combine", packaged["combine"], "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    assert f"-> {out}" in capsys.readouterr().out
    fitted = json.loads(out.read_text())
    assert fitted["source_sha256"] == packaged["source_sha256"]
    same = {"slope_points_per_nat", "bounds", "schedules", "n_examples", "power", "datasets"}
    assert {k: fitted[k] for k in same} == {k: packaged[k] for k in same}
    prior = SlopePrior.load(out)
    assert prior.upper(0.5) <= prior.upper(0.6) <= prior.upper(0.9) and prior.n_examples == 204


def test_a_thin_grid_is_not_written_into_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("slope_prior")
    before = sorted(PACKAGED.parent.iterdir())
    with pytest.raises(SystemExit, match="fewer than the 10000 a packaged prior rests on"):
        bench.main(["--rows", str(ROWS), "--min-examples", "10000"])
    assert sorted(PACKAGED.parent.iterdir()) == before
