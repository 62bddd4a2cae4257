"""benchmarks/decision_rule.py on the committed grids, with few replays: one row per (budget, rule, n),
rates within [0, 1], the power curve of the default rule in ``--out``, the grid's tables and figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"


def _check(results: list[dict[str, object]]) -> None:
    for r in results:
        assert 0 <= r["over_budget"] <= 1 and 0 <= r["no_pick"] <= 1  # type: ignore[operator]
        assert r["speed_kept"] > 0 and r["best_within_budget_on_test"] >= 1.0  # type: ignore[operator]
        assert r["best_within_budget_on_pool"] >= 1.0  # type: ignore[operator]


def test_whole_schedule_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("decision_rule")
    out, plot = tmp_path / "rule.json", tmp_path / "grid.png"
    argv = ["--rows", str(DATA / "objective_noise_512.rows.jsonl"), "--budget", "2,3", "--sizes", "13",
            "--resamples", "3", "--settings", "default", "--schedules", "--plot", str(plot), "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| schedule | FLOP speedup |" in printed and plot.stat().st_size > 0
    payload = json.loads(out.read_text())
    results = payload["results"]
    assert [(r["budget"], r["n"], r["resamples"], r["default"]) for r in results] == [
        (2.0, 13, 3, True), (3.0, 13, 3, True)
    ]  # fmt: skip
    _check(results)
    assert [(p["budget"], p["n"], p["replays"]) for p in payload["power"]] == [(2.0, 13, 3), (3.0, 13, 3)]


def test_per_example_grid_with_its_test_rows(tmp_path: Path) -> None:
    bench = load_benchmark("decision_rule")
    out = tmp_path / "rule.json"
    argv = ["--rows", str(DATA / "grid-smollm2-135m-openqa-validation-1024.jsonl"),
            "--test-rows", str(DATA / "grid-smollm2-135m-openqa-test-1024.jsonl"), "--sizes", "13,300",
            "--resamples", "2", "--confirm-k", "2", "--fresh", "8", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    payload = json.loads(out.read_text())
    results = payload["results"]
    assert [r["n"] for r in results] == [13, 300] and payload["fresh"] == 8
    assert all("fresh KL on 8" in r["rule"] and r["pool"] >= 13 for r in results)
    _check(results)
    # the recorded test KLs give the winner's curse its ratio wherever something was picked
    assert all(r["pick_kl_test_over_draw"] is not None for r in results if r["no_pick"] < 1)


def test_a_prior_of_another_exponent_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("decision_rule")
    prior = Path(__file__).resolve().parents[2] / "tuner" / "statistics" / "priors" / "smollm2-135m-1024.json"
    with pytest.raises(SystemExit):
        bench.main(["--prior", str(prior), "--exponent", "0.5"])
    assert "fitted at exponent 1" in capsys.readouterr().err


def test_the_score_a_scaled_prior_decides_at(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--score-levels``: the rule replayed with a scaled prior's deciding bound read at the draw's
    unpruned score (none), at its bound at another level, or with the score taken as exact, beside
    the study's default (at --confidence's bound). Without the fresh check the certified bound reads
    nothing, so exact and none decide alike; the default, more careful on the same draws, keeps no
    more speed than either."""
    bench = load_benchmark("decision_rule")
    prior = (
        Path(__file__).resolve().parents[2]
        / "tuner"
        / "statistics"
        / "priors"
        / "smollm2-135m-2048-p0.5.json"
    )
    out = tmp_path / "rule.json"
    argv = ["--rows", str(DATA / "grid-smollm2-135m-openqa-validation-2048-bfloat16.jsonl"),
            "--test-rows", str(DATA / "grid-smollm2-135m-openqa-test-2048-bfloat16.jsonl"), "--sizes", "11",
            "--resamples", "12", "--confirm-k", "2", "--exponent", "0.5", "--prior", str(prior),
            "--score-levels", "exact,none,0.75", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    default, exact, none, at75 = json.loads(out.read_text())["results"]
    assert "decides at" not in default["rule"] and "exact" not in default["rule"]  # the study's own
    assert "score taken as exact" in exact["rule"] and "decides at the score," in none["rule"]
    assert "decides at the score's 0.75 bound" in at75["rule"]
    _check([default, exact, none, at75])
    assert (exact["over_budget"], exact["speed_kept"]) == (none["over_budget"], none["speed_kept"])
    assert default["speed_kept"] <= at75["speed_kept"] <= none["speed_kept"]
    assert default["speed_kept"] < none["speed_kept"]  # the bound decides: on some draws a slower pick
    capsys.readouterr()
    levels = argv.index("--score-levels")
    with pytest.raises(SystemExit):  # a level out of range
        bench.main([*argv[: levels + 1], "none,1.5"])
    assert "levels in [0.5, 1), or none" in capsys.readouterr().err
    at = argv.index("--prior")
    with pytest.raises(SystemExit):  # nothing to scale without a prior
        bench.main([*argv[:at], *argv[at + 2 : levels + 2]])
    assert "give --prior too" in capsys.readouterr().err
