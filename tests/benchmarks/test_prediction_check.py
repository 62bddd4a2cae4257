"""benchmarks/prediction_check.py: a study's predicted loss for its pick (the calibration's own
function) against the pick's test loss (the product's estimator), the unpruned-score draws, pools of
picks on the same records, and clear refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.support import load_benchmark
from tuner.evaluation.runner import ExampleResult, loss_estimate
from tuner.statistics.calibration import Calibration, Floor
from tuner.statistics.prior import packaged_all


def _calibration(slope: float, baseline_score: float | None) -> Calibration:
    floor = Floor(
        prior="p",
        prior_n_examples=200,
        prior_slope=slope,
        prior_upper=slope + 1.0,
        prior_upper_confidence=slope + 2.0,
        own_slope=-1.0,
        own_upper=0.0,
        own_upper_confidence=0.5,
        examples_needed=None,
        applied=True,
        scale=0.5,
        baseline_score=baseline_score,
    )
    return Calibration(
        slope=slope,
        slope_upper=slope + 1.0,
        level=0.6,
        n_examples=4,
        trials=(1, 2),
        max_scored_kl=0.5,
        points=((1, 0.5, -1.0), (2, 0.01, 0.0)),
        confidence=0.9,
        slope_upper_confidence=slope + 2.0,
        floor=floor,
        exponent=0.5,
    )


def _rows(scores: list[float], method: str) -> list[ExampleResult]:
    return [
        ExampleResult(f"d{i % 2}", f"q{i}", method, "", s, 0.1, 0.2, 100, 4, 0.5)
        for i, s in enumerate(scores)
    ]


def _study(folder: Path, *, kl: float, pick_scores: list[float], baseline_score: float | None = 10.0) -> Path:
    folder.mkdir(parents=True)
    conf = {
        "recommended_trial": 7,
        "calibration": _calibration(4.0, baseline_score).to_dict(),
        "candidates": [{"trial": 9, "search_loss": 0.9}, {"trial": 7, "search_loss": kl}],
    }
    (folder / "confirmation.json").write_text(json.dumps(conf))
    base = _rows([0.5, 0.3, 0.1, 0.2, 0.4, 0.6] * 3, "baseline")
    (folder / "test.baseline.jsonl").write_text(ExampleResult.to_jsonl(base))
    (folder / "test.lazyllm.jsonl").write_text(ExampleResult.to_jsonl(_rows(pick_scores, "lazyllm")))
    return folder


BASE = [0.5, 0.3, 0.1, 0.2, 0.4, 0.6] * 3


def test_prediction_is_the_calibrations_and_the_test_loss_the_products(tmp_path: Path) -> None:
    bench = load_benchmark("prediction_check")
    worse = [s - 0.05 for s in BASE]  # 5 points lost on every record
    study = bench.read_study("a", _study(tmp_path / "a", kl=0.04, pick_scores=worse))
    c = bench.check(study, n_draws=500)
    assert c.trials == (7,) and c.kl == 0.04  # the recommended trial's KL, not the other candidate's
    assert (c.predicted, c.bound) == pytest.approx((4.0 * 0.2, 5.0 * 0.2))  # slope x KL^0.5
    assert c.bound_confidence == pytest.approx(6.0 * 0.2)
    assert c.test == loss_estimate(study.pick, study.baseline)
    assert c.test.value == pytest.approx(5.0) and not c.inside  # 0.8 predicted, 5 lost everywhere
    assert c.test_unpruned == pytest.approx(35.0)
    # 4 calibration examples over 2 datasets: draws of 2 per dataset; a validation score of 10 is below
    # every draw's (the lowest pair per dataset averages 15 and 25 points), so no draw is at or below it
    assert c.draws is not None and c.draws.per_dataset == 2 and c.draws.at_or_below == 0.0
    assert 15.0 <= c.draws.low <= c.draws.high <= 55.0
    high = bench.check(
        bench.read_study("h", _study(tmp_path / "h", kl=0.04, pick_scores=worse, baseline_score=60.0)),
        n_draws=500,
    )
    assert high.draws is not None and high.draws.at_or_below == 1.0
    unscaled = bench.read_study("u", _study(tmp_path / "u", kl=0.04, pick_scores=worse, baseline_score=None))
    assert bench.check(unscaled, n_draws=500).draws is None


def test_a_pool_averages_its_picks_per_record(tmp_path: Path) -> None:
    bench = load_benchmark("prediction_check")
    a = bench.read_study("a", _study(tmp_path / "a", kl=0.04, pick_scores=[s - 0.02 for s in BASE]))
    b = bench.read_study("b", _study(tmp_path / "b", kl=0.16, pick_scores=[s - 0.06 for s in BASE]))
    pool = bench.pooled("ab", [a, b])
    assert pool.trials == (7, 7) and pool.test.value == pytest.approx(4.0)  # (2 + 6) / 2 points
    assert pool.predicted == pytest.approx((0.8 + 1.6) / 2)
    other = dataclasses.replace(b, pick=b.pick[:-1])
    with pytest.raises(ValueError, match="different test records"):
        bench.pooled("ab", [a, other])


def test_cli_writes_the_table_and_the_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("prediction_check")
    a = _study(tmp_path / "a", kl=0.04, pick_scores=BASE)
    b = _study(tmp_path / "b", kl=0.16, pick_scores=[s - 0.01 for s in BASE])
    out = tmp_path / "out"
    assert bench.main([f"a={a}", f"b={b}", "--pool", "ab=a,b", "--draws", "200", "--out-dir", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| a | #7 | 0.0400 | 0.80 [1.00, 1.20] | 0.00 [0.00, 0.00] | 18 | no |" in text
    assert "| ab | mean of #7, #7 |" in text
    assert (out / "rows.md").read_text() == text
    assert [r["name"] for r in json.loads((out / "rows.json").read_text())] == ["a", "b", "ab"]
    assert (out / "check.png").stat().st_size > 1000


def test_bad_input_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("prediction_check")
    a = _study(tmp_path / "a", kl=0.04, pick_scores=BASE)
    (tmp_path / "empty").mkdir()
    for argv, message in [
        ([f"e={tmp_path / 'empty'}"], "has no confirmation.json"),
        ([str(a)], "is not NAME=VALUE"),
        ([f"a={a}", "--pool", "p=a,zz"], "names 'zz'"),
    ]:
        assert bench.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
    (a / "test.lazyllm.jsonl").unlink()
    assert bench.main([f"a={a}"]) == 2
    assert "lacks test.lazyllm.jsonl" in capsys.readouterr().err


def test_refloor_reads_the_certified_bound_at_the_unpruned_scores_bound(tmp_path: Path) -> None:
    """The study's own fit floored again with the packaged prior it names: at rows that all score as
    the recorded score, the certified bound is the recorded one; at rows that spread, it is read at
    their bound, higher; a calibration that its own fit does not give back is refused."""
    bench = load_benchmark("prediction_check")
    prior = packaged_all("smollm2-135m", 0.5)[-1]
    own = dataclasses.replace(
        _calibration(4.0, None), floor=None, slope=-1.0, slope_upper=0.0, slope_upper_confidence=0.5
    )
    floored = own.floored(prior, 2.0, 10.0)
    folder = _study(tmp_path / "a", kl=0.04, pick_scores=BASE)
    conf = json.loads((folder / "confirmation.json").read_text())
    (folder / "confirmation.json").write_text(json.dumps({**conf, "calibration": floored.to_dict()}))
    study = bench.read_study("a", folder)
    flat = bench.refloor(study, _rows([0.1] * 12, "baseline"))  # 10 points on every record: no spread
    assert flat.score == pytest.approx(10.0) and flat.score_upper == pytest.approx(10.0)
    assert flat.bound_confidence == pytest.approx(floored.upper_at_confidence(0.04))
    spread = bench.refloor(study, _rows([0.0, 0.2] * 6, "baseline"))  # 10 points on average, spread
    assert spread.score == pytest.approx(10.0) and spread.score_upper > 10.0
    expected = floored.upper_at_confidence(0.04) * spread.score_upper / 10.0
    assert spread.bound_confidence == pytest.approx(expected)
    assert bench.check(study, rows=_rows([0.0, 0.2] * 6, "baseline")).refloored == spread
    tampered = dataclasses.replace(
        study, calibration=dataclasses.replace(floored, slope_upper_confidence=99.0)
    )
    with pytest.raises(ValueError, match="does not give back its calibration"):
        bench.refloor(tampered, _rows([0.1] * 12, "baseline"))


def test_test_rows_come_from_an_earlier_decision_of_the_same_pick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("prediction_check")
    first = _study(tmp_path / "first", kl=0.16, pick_scores=[s - 0.05 for s in BASE])
    again = tmp_path / "again"  # decided again: its own prediction (KL 0.04), no test run of its own
    again.mkdir()
    conf = json.loads((first / "confirmation.json").read_text())
    conf["candidates"][1]["search_loss"] = 0.04
    (again / "confirmation.json").write_text(json.dumps(conf))
    schedule = {"format": "lazyllm-schedule", "percentiles": {"3": 40}, "metadata": {"study": "first"}}
    (first / "recommended.json").write_text(json.dumps(schedule))
    (again / "recommended.json").write_text(json.dumps({**schedule, "metadata": {"study": "again"}}))
    study = bench.read_study("again", again, test_folder=first)
    c = bench.check(study, n_draws=0)
    assert c.kl == 0.04 and c.predicted == pytest.approx(4.0 * 0.2)  # the new decision's prediction
    assert c.test.value == pytest.approx(5.0) and c.test.n == 18  # the first decision's test rows
    assert bench.main([f"a={again}", "--test-rows", f"a={first}", "--draws", "0"]) == 0
    assert "| a | #7 | 0.0400 |" in capsys.readouterr().out
    (again / "recommended.json").write_text(json.dumps({**schedule, "percentiles": {"3": 50}}))
    assert bench.main([f"a={again}", "--test-rows", f"a={first}"]) == 2
    err = capsys.readouterr().err
    assert "recommends another schedule" in err and err.count("\n") == 1
    assert bench.main([f"a={again}", "--test-rows", f"b={first}"]) == 2
    assert "--test-rows names 'b'" in capsys.readouterr().err
    assert bench.main([f"a={again}"]) == 2  # without --test-rows the folder's own rows are missing
