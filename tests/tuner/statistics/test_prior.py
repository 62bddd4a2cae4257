"""tuner.statistics.prior: the slope prior file, the power curve's count, and the floor of an
underpowered calibration (the rule, the report and the benchmark that builds the prior)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

import tuner.stages.rule as rule
import tuner.statistics.prior as prior_module
from tests.support import load_benchmark
from tuner.evaluation.losses import FidelityLoss, ScoreLoss
from tuner.statistics.calibration import Calibration, ScoredSchedule, UnprunedScore
from tuner.statistics.prior import PowerPoint, SlopePrior, nearest, packaged, packaged_path, resolve
from tuner.statistics.shape import LINEAR, SQUARE_ROOT
from tuner.study.settings import SearchSettings


def _prior(
    slope: float = 12.0, power: tuple[PowerPoint, ...] = (), model: str = "smollm2-135m", tokens: int = 1024
) -> SlopePrior:
    return SlopePrior(
        model=model, task="openqa", max_prompt_tokens=tokens, n_examples=300, schedules=("a", "b"),
        slope=slope, bounds=((0.5, slope), (0.6, slope + 1.0), (0.9, slope + 4.0), (0.99, slope + 8.0)),
        source="rows.jsonl", source_sha256="ab" * 32, created="2026-12-02", power=power,
    )  # fmt: skip


def _no_cost(n: int = 13) -> Calibration:
    """What seed 1's 13 examples said: no task-score cost of KL at any level."""
    return Calibration(
        slope=-6.0, slope_upper=-1.5, level=0.6, n_examples=n, trials=(1, 2), max_scored_kl=0.4,
        points=((1, 0.3, -1.8), (2, 0.1, -0.6)), confidence=0.9, slope_upper_confidence=-0.5,
    )  # fmt: skip


def test_a_prior_file_round_trips_and_bad_files_are_one_line(tmp_path: Path) -> None:
    prior = _prior(power=(PowerPoint(2.0, 50, 0.2, 0.9, 100),))
    path = prior.save(tmp_path / "p.json")
    assert SlopePrior.load(path) == prior
    assert prior.id == "smollm2-135m/openqa-1024@" + "ab" * 6
    with pytest.raises(ValueError, match="no such file"):
        SlopePrior.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"model": "m"}')
    with pytest.raises(ValueError, match=r"bad\.json: not a slope prior file") as e:
        SlopePrior.load(tmp_path / "bad.json")
    assert "\n" not in str(e.value)
    old = json.loads(path.read_text()) | {"format": 0}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="format 0"):
        SlopePrior.load(tmp_path / "old.json")
    with pytest.raises(ValueError, match="measured on 'smollm2-135m', not 'gemma3-270m'"):
        resolve(str(path), "gemma3-270m")
    assert resolve("none", "smollm2-135m") is None
    assert resolve("auto", "no-such-model") is None


def test_a_study_reads_the_prior_recorded_nearest_its_prompt_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short, long = _prior(10.0, tokens=1024), _prior(20.0, tokens=2048)
    assert nearest([long, short], 2048) == long
    assert nearest([long, short], 4096) == long
    assert nearest([long, short], 1200) == short
    assert nearest([long, short], 512) == short
    a, b = _prior(1.0, tokens=1000), _prior(2.0, tokens=4000)
    assert nearest([b, a], 2000) == a  # as far by ratio from both: the tie goes to the shorter
    assert nearest([long, short], None) == short
    assert nearest([], 2048) is None
    # the package folder: each model's files by their own model field, whatever the file is called
    monkeypatch.setattr(prior_module, "PRIOR_DIR", tmp_path)
    short.save(tmp_path / "smollm2-135m-1024.json")
    long.save(tmp_path / "smollm2-135m-2048.json")
    _prior(30.0, model="smollm2-135m-extra", tokens=2048).save(tmp_path / "smollm2-135m-extra-2048.json")
    assert packaged("smollm2-135m", 2048) == long
    assert resolve("auto", "smollm2-135m", 1024) == short
    assert packaged("smollm2-135m-extra", 1024).slope == 30.0  # type: ignore[union-attr]
    assert SearchSettings(max_prompt_tokens=2048, calibration_exponent=LINEAR).prior == long
    assert SearchSettings(max_prompt_tokens=1024, calibration_exponent=LINEAR).prior == short
    assert packaged_path("smollm2-135m", 2048) == tmp_path / "smollm2-135m-2048.json"


def test_bounds_interpolate_between_levels_and_refuse_outside_them() -> None:
    prior = _prior(12.0)
    assert prior.upper(0.6) == 13.0
    assert prior.upper(0.75) == pytest.approx(14.5)
    with pytest.raises(ValueError, match=r"holds bounds for 0.6..0.8; rebuild it"):
        _prior(12.0).__class__(**{**vars(prior), "bounds": ((0.6, 1.0), (0.8, 2.0))}).upper(0.9)


def test_the_power_curve_names_the_smallest_n_within_the_target_at_the_budget() -> None:
    rows = (
        PowerPoint(2.0, 13, 0.45, 0.8, 500), PowerPoint(2.0, 50, 0.18, 0.9, 500),
        PowerPoint(2.0, 100, 0.08, 0.95, 500), PowerPoint(2.0, 200, 0.04, 0.97, 500),
        PowerPoint(4.0, 13, 0.09, 0.9, 500),
    )  # fmt: skip
    prior = _prior(power=rows)
    assert prior.examples_needed(2.0) == 100
    assert prior.examples_needed(3.0) == 100  # the largest recorded budget not above it: 2
    assert prior.examples_needed(4.0) == 13
    assert prior.examples_needed(1.0) is None  # no curve at or below a 1-point budget
    assert _prior().examples_needed(2.0) is None


def test_an_underpowered_calibration_is_floored_at_the_prior_and_a_powered_one_is_not() -> None:
    prior = _prior(12.0, power=(PowerPoint(2.0, 100, 0.05, 0.9, 500),))
    low = _no_cost(13).floored(prior, 2.0)
    assert (low.slope, low.slope_upper, low.slope_upper_confidence) == (12.0, 13.0, 16.0)
    assert low.floor is not None and low.floor.applied and low.floor.binds
    assert (low.floor.own_slope, low.floor.own_upper, low.floor.examples_needed) == (-6.0, -1.5, 100)
    assert "floored at the open-QA prior's 12.0" in low.floor_text()
    assert Calibration.from_dict(json.loads(json.dumps(low.to_dict()))) == low
    seen = Calibration(3.0, 5.0, 0.6, 150, (1,), 0.4, ((1, 0.3, 0.9),), 0.9, 7.0)
    high = seen.floored(prior, 2.0)
    assert (high.slope, high.slope_upper) == (3.0, 5.0)  # enough examples: its own calibration decides
    assert high.floor is not None and not high.floor.applied and high.floor_text() == ""
    # with no power curve recorded every study counts as underpowered
    assert _no_cost(500).floored(_prior(12.0), 2.0).slope == 12.0
    # a floor never lowers a calibration that measured more cost than the prior
    steep = Calibration(40.0, 60.0, 0.6, 13, (1,), 0.4, ((1, 0.3, 12.0),), 0.9, 80.0).floored(prior, 2.0)
    assert (steep.slope, steep.slope_upper, steep.slope_upper_confidence) == (40.0, 60.0, 80.0)
    assert steep.floor is not None and steep.floor.applied and not steep.floor.binds


KEYS = [f"d{i % 2}/r{i}" for i in range(13)]


def test_the_rule_with_a_prior_no_longer_reads_no_cost_seen_as_no_cost() -> None:
    """Seed 1's failure: 13 examples show no cost, so a schedule drifting 0.3 nats was certified."""
    from tests.tuner.stages.test_rule import _record

    records = [_record(0, 1.0, 0.0, 0.0), _record(1, 1.4, 0.02, 30.0), _record(2, 1.97, 0.3, 60.0)]
    keys = list(records[1].per_example)

    def evidence(
        rs: Sequence[rule.TrialRecord],
    ) -> list[ScoredSchedule]:  # every drifting one *gains* a little
        return [
            ScoredSchedule(r.number, r.per_example, {k: -5.0 * v for k, v in r.per_example.items()})
            for r in rs
        ]

    def decide(prior: SlopePrior | None) -> rule.PooledDecision:
        return rule.pooled_rule(
            records, FidelityLoss(1.0), ScoreLoss(2.0), 6, dict.fromkeys(keys, 1.0), evidence,
            level=0.6, confidence=0.9, prior=prior,
        )  # fmt: skip

    alone = decide(None)
    assert alone.picked is not None and alone.picked.number == 2  # certified on "no cost seen"
    floored = decide(_prior(12.0))
    assert floored.picked is not None and floored.picked.number == 1  # 13 x 0.3 = 3.9 points > 2
    assert "floored at the open-QA prior's 12.0" in floored.verdicts[0].why


def test_the_builder_fits_the_product_estimator_on_grid_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "grid.jsonl"
    table = {"a": {"schedule": {"p": 1}}, "b": {"schedule": {"p": 2}}, "b twin": {"schedule": {"p": 2}},
             "keep-all (control)": {"schedule": {"p": 0}, "family": "control"}}  # fmt: skip
    rows.with_suffix(".schedules.json").write_text(json.dumps(table))
    lines = []
    for i in range(12):
        ex, ds = f"{'hs'[i % 2]}/{i}", "hotpotqa-long" if i % 2 == 0 else "squad-long"
        for name, kl, lost in (("a", 0.1 * (1 + i % 3), 0.5 * (i % 3 == 0)), ("b", 0.3, float(i % 4 == 0))):
            lines.append({"schedule": name, "example": ex, "dataset": ds, "kl_nats_per_token": kl,
                          "score": 1.0 - lost, "baseline_score": 1.0})  # fmt: skip
        # the recorder's keep-all control: its noise would add loss at no KL; left out
        lines.append({"schedule": "keep-all (control)", "example": ex, "dataset": ds, "kl_nats_per_token": 0.0,
                      "score": 0.5, "baseline_score": 1.0})  # fmt: skip
        if i < 2:  # an older name of schedule b, on two examples only: left out
            lines.append({"schedule": "b twin", "example": ex, "dataset": ds, "kl_nats_per_token": 0.3,
                          "score": 1.0, "baseline_score": 1.0})  # fmt: skip
    lines.append({"schedule": "peer", "example": "h/0", "dataset": "hotpotqa-long", "kl_nats_per_token": None,
                  "score": 0.0, "baseline_score": 1.0})  # fmt: skip
    rows.write_text("".join(json.dumps(r) + "\n" for r in lines))
    out = tmp_path / "prior.json"
    assert load_benchmark("slope_prior").main(["--rows", str(rows), "--out", str(out)]) == 0
    prior = SlopePrior.load(out)
    assert prior.schedules == ("a", "b") and prior.n_examples == 12
    # macro mean over the two datasets (6 examples each) of 100 x loss, over the mean KL
    loss_a = 100 * (0.5 * 2 / 6 + 0.5 * 2 / 6) / 2  # i % 3 == 0 hits i = 0, 6 (h) and 3, 9 (s)
    loss_b = 100 * (3 / 6 + 0 / 6) / 2  # i % 4 == 0: i = 0, 4, 8, all of them h
    assert prior.slope == pytest.approx((loss_a + loss_b) / (0.2 + 0.3))
    assert prior.upper(0.9) >= prior.upper(0.6) >= prior.slope - 1e-9
    assert prior.baseline_score == pytest.approx(100.0) and prior.scaling == "absolute"
    # each dataset's own fit: HotpotQA 66.7 points over 0.5 nats, SQuAD 16.7 over 0.5; steepest takes it
    by = {name: (n, slope) for name, n, slope in prior.datasets}
    assert by["hotpotqa-long"][0] == by["squad-long"][0] == 6
    assert by["hotpotqa-long"][1] == pytest.approx(133.33, abs=0.01) and by["squad-long"][1] == pytest.approx(
        33.33, abs=0.01
    )
    steep = tmp_path / "steep.json"
    assert (
        load_benchmark("slope_prior").main(
            ["--rows", str(rows), "--out", str(steep), "--combine", "steepest"]
        )
        == 0
    )
    steepest = SlopePrior.load(steep)
    assert steepest.combine == "steepest" and steepest.slope == pytest.approx(133.33, abs=0.01)
    assert steepest.upper(0.9) >= steepest.upper(0.6) > prior.upper(0.6)
    # fitted on decision_rule.py's pool side only: the held-out examples are left out
    half = tmp_path / "half.json"
    assert (
        load_benchmark("slope_prior").main(["--rows", str(rows), "--out", str(half), "--holdout", "0.5"]) == 0
    )
    kept = SlopePrior.load(half).n_examples
    assert kept == sum(
        not load_benchmark("decision_rule").held_out(f"{'hs'[i % 2]}/{i}", 0.5) for i in range(12)
    )
    assert "on 12 examples x 2 schedules" in capsys.readouterr().out
    # into the package (where studies read it) only on enough examples; nothing is written otherwise
    from tuner.statistics.prior import PRIOR_DIR

    before = sorted(PRIOR_DIR.glob("*.json")) if PRIOR_DIR.exists() else []
    with pytest.raises(SystemExit, match="share 12 validation examples, fewer than the 200"):
        load_benchmark("slope_prior").main(["--rows", str(rows), "--model", "tiny-test-model"])
    assert (sorted(PRIOR_DIR.glob("*.json")) if PRIOR_DIR.exists() else []) == before


def test_a_study_reads_the_prior_once_and_refuses_a_bad_one(tmp_path: Path) -> None:
    path = _prior().save(tmp_path / "p.json")
    assert SearchSettings(slope_prior=str(path), calibration_exponent=LINEAR).prior == _prior()
    assert SearchSettings(slope_prior="none").prior is None
    assert SearchSettings().prior == packaged("smollm2-135m", exponent=SQUARE_ROOT)  # the default shape's
    with pytest.raises(ValueError, match="no such file"):
        SearchSettings(slope_prior=str(tmp_path / "nope.json"))
    narrow = (
        _prior().__class__(**{**vars(_prior()), "bounds": ((0.5, 1.0), (0.8, 2.0))}).save(tmp_path / "n.json")
    )
    with pytest.raises(ValueError, match=r"holds bounds for 0\.5\.\.0\.8"):
        SearchSettings(
            slope_prior=str(narrow), calibration_exponent=LINEAR
        )  # the rule reads the bound at --confidence 0.9


def test_a_baseline_scaled_prior_is_read_at_the_studys_unpruned_score() -> None:
    """12 points per nat measured where the unpruned model scores 8: a study scoring 16 has twice as
    much to lose, so its floor is 24; an absolute prior ignores the score."""
    base = {**vars(_prior(12.0)), "baseline_score": 8.0}
    scaled = SlopePrior(**{**base, "scaling": "baseline"})
    assert scaled.scale(16.0) == 2.0 and scaled.scale(-1.0) == 0.0
    assert SlopePrior(**base).scale(16.0) == 1.0
    floored = _no_cost(13).floored(scaled, 2.0, baseline_score=16.0)
    assert (floored.slope, floored.slope_upper, floored.slope_upper_confidence) == (24.0, 26.0, 32.0)
    assert floored.floor is not None and (floored.floor.scale, floored.floor.baseline_score) == (2.0, 16.0)
    assert Calibration.from_dict(json.loads(json.dumps(floored.to_dict()))) == floored
    with pytest.raises(ValueError, match="scales by the unpruned score; give the study's"):
        _no_cost(13).floored(scaled, 2.0)
    with pytest.raises(ValueError, match="needs the grid's baseline_score > 0"):
        SlopePrior(**{**vars(_prior(12.0)), "scaling": "baseline"})
    with pytest.raises(ValueError, match="scaling = 'relative'"):
        SlopePrior(**{**base, "scaling": "relative"})


def test_a_scaled_priors_certified_bound_is_read_at_the_unpruned_scores_bound() -> None:
    """The unpruned score that scales the prior is itself measured on a dozen examples: the bound at
    --confidence (what "certified" means) is read at the score's own bound at that level, so a study
    whose few examples happened to score low does not certify on all of it. The slope and the bound
    that decides stay at the score. A number is taken as exact; an absolute prior ignores the score."""
    base = {**vars(_prior(12.0)), "baseline_score": 8.0}
    scaled = SlopePrior(**{**base, "scaling": "baseline"})
    score = UnprunedScore(value=4.0, n=11, upper=12.0, level=0.9)
    floored = _no_cost(13).floored(scaled, 2.0, baseline_score=score)
    # 12 and 13 points per nat at scale 0.5 (slope, bound at 0.6), 16 at scale 1.5 (bound at 0.9)
    assert (floored.slope, floored.slope_upper, floored.slope_upper_confidence) == (6.0, 6.5, 24.0)
    f = floored.floor
    assert f is not None and (f.scale, f.baseline_score, f.baseline_upper_confidence) == (0.5, 4.0, 12.0)
    assert Calibration.from_dict(json.loads(json.dumps(floored.to_dict()))) == floored
    exact = _no_cost(13).floored(scaled, 2.0, baseline_score=4.0)
    assert (exact.slope, exact.slope_upper, exact.slope_upper_confidence) == (6.0, 6.5, 8.0)
    assert exact.floor is not None and exact.floor.baseline_upper_confidence is None
    absolute = _no_cost(13).floored(SlopePrior(**base), 2.0, baseline_score=score)
    assert (absolute.slope, absolute.slope_upper, absolute.slope_upper_confidence) == (12.0, 13.0, 16.0)
    assert absolute.floor is not None and absolute.floor.baseline_upper_confidence is None
    with pytest.raises(ValueError, match=r"bound is at level 0\.6, the calibration's confidence at 0\.9"):
        _no_cost(13).floored(scaled, 2.0, baseline_score=UnprunedScore(4.0, 11, 5.0, 0.6))


def test_a_scaled_prior_decides_at_the_unpruned_scores_bound_when_asked() -> None:
    """``decide_at_bound`` (a study's default): the bound that decides is read at the score's bound
    too, so a study whose dozen examples happened to score low is not let through on a prior scaled
    down by them; the slope, the point prediction, stays at the score. A number is taken as exact
    (nothing to read it at), and the flag is recorded."""
    scaled = SlopePrior(**{**vars(_prior(12.0)), "baseline_score": 8.0, "scaling": "baseline"})
    score = UnprunedScore(value=4.0, n=11, upper=12.0, level=0.9)
    decided = _no_cost(13).floored(scaled, 2.0, baseline_score=score, decide_at_bound=True)
    # slope 12 at scale 0.5; the bounds 13 (at 0.6) and 16 (at 0.9), both at scale 1.5
    assert (decided.slope, decided.slope_upper, decided.slope_upper_confidence) == (6.0, 19.5, 24.0)
    f = decided.floor
    assert f is not None and f.decided_at_bound and f.prior_upper == 19.5
    assert Calibration.from_dict(json.loads(json.dumps(decided.to_dict()))) == decided
    assert decided.max_kl(2.0) < _no_cost(13).floored(scaled, 2.0, baseline_score=score).max_kl(2.0)
    exact = _no_cost(13).floored(scaled, 2.0, baseline_score=4.0, decide_at_bound=True)
    assert exact.slope_upper == 6.5 and exact.floor is not None and not exact.floor.decided_at_bound


def test_the_unpruned_scores_bound_is_the_bootstraps_of_its_macro_mean() -> None:
    """Eleven examples over two datasets: the score is the macro mean; its bound grows with the level,
    and is the score itself where every example scores alike."""
    scores = [0.0, 0.0, 0.0, 50.0, 0.0, 0.0, 10.0, 0.0, 0.0, 0.0, 40.0]
    weights = [1 / 10] * 5 + [1 / 12] * 6
    s = UnprunedScore.measured(scores, weights, level=0.9)
    assert s.value == pytest.approx((50.0 / 5 + 50.0 / 6) / 2) and (s.n, s.level) == (11, 0.9)
    assert s.value < UnprunedScore.measured(scores, weights, level=0.6).upper < s.upper < 50.0
    flat = UnprunedScore.measured([7.0] * 11, weights, level=0.9)
    assert (flat.value, flat.upper) == pytest.approx((7.0, 7.0))
    assert UnprunedScore.measured(scores, weights, level=0.9, value=9.25).value == 9.25


def test_the_rule_certifies_a_scaled_prior_at_the_unpruned_scores_bound() -> None:
    """A study whose dozen examples score 4 points against the grid's 8: the pick is the same either
    way (the decision reads the score), but read at the score's 90% bound (9) the pick's certified
    bound is 2.25 times the one read at the score, and it is no longer certified."""
    from tests.tuner.stages.test_rule import _record

    records = [_record(0, 1.0, 0.0, 0.0), _record(1, 1.4, 0.02, 30.0), _record(2, 1.97, 0.3, 60.0)]
    keys = list(records[1].per_example)
    scaled = SlopePrior(**{**vars(_prior(12.0)), "baseline_score": 8.0, "scaling": "baseline"})

    def evidence(rs: Sequence[rule.TrialRecord]) -> list[ScoredSchedule]:  # no cost seen
        return [ScoredSchedule(r.number, r.per_example, dict.fromkeys(r.per_example, 0.0)) for r in rs]

    def decide(score: float | UnprunedScore) -> rule.PooledDecision:
        return rule.pooled_rule(
            records, FidelityLoss(1.0), ScoreLoss(2.0), 6, dict.fromkeys(keys, 1.0), evidence,
            level=0.6, confidence=0.9, prior=scaled, baseline_score=score, exponent=LINEAR,
        )  # fmt: skip

    at_point, at_bound = decide(4.0), decide(UnprunedScore(value=4.0, n=12, upper=9.0, level=0.9))
    assert at_point.picked is not None and at_point.picked.number == 2
    assert at_bound.picked is not None and at_bound.picked.number == 2  # 6.5 x 0.3 = 1.95 points
    assert at_point.calibration is not None and at_bound.calibration is not None
    certified = at_point.calibration.upper_at_confidence(0.3)
    assert certified == pytest.approx(8.0 * 0.3) and certified > 2.0  # 16 x 0.5 per nat
    assert at_bound.calibration.upper_at_confidence(0.3) == pytest.approx(18.0 * 0.3)  # 16 x 9 / 8


def test_the_prior_builder_and_the_replay_hold_out_the_same_examples() -> None:
    assert load_benchmark("slope_prior").HOLDOUT_SEED == load_benchmark("decision_rule").HOLDOUT_SEED


def test_a_calibration_that_sees_no_cost_is_floored_whatever_its_size() -> None:
    """The power curve says 13 examples are enough, but "no cost seen" on them is not "no cost": the
    prior measured one, so the floor applies; a study with a cost of its own and enough examples is not
    floored."""
    enough = _prior(power=(PowerPoint(2.0, 13, 0.05, 0.9, 100),))
    floored = _no_cost(13).floored(enough, 2.0)
    assert floored.floor is not None and floored.floor.applied and floored.floor.binds
    assert (floored.slope, floored.slope_upper) == (12.0, 13.0)
    own = Calibration(
        slope=20.0, slope_upper=25.0, level=0.6, n_examples=13, trials=(1,), max_scored_kl=0.4,
        points=((1, 0.3, 6.0),), confidence=0.9, slope_upper_confidence=30.0,
    )  # fmt: skip
    kept = own.floored(enough, 2.0)
    assert (
        kept.floor is not None and not kept.floor.applied and (kept.slope, kept.slope_upper) == (20.0, 25.0)
    )


def test_a_prior_is_read_only_at_the_exponent_it_was_fitted_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line, root = _prior(12.0, tokens=2048), SlopePrior(**{**vars(_prior(5.0, tokens=2048)), "exponent": 0.5})
    assert root.id == "smollm2-135m/openqa-2048-p0.5@" + "ab" * 6 and root.unit == "points per nat^0.5"
    assert SlopePrior.load(root.save(tmp_path / "r.json")) == root
    monkeypatch.setattr(prior_module, "PRIOR_DIR", tmp_path)
    line.save(packaged_path("smollm2-135m", 2048))
    root.save(packaged_path("smollm2-135m", 2048, 0.5))
    assert packaged_path("smollm2-135m", 2048, 0.5).name == "smollm2-135m-2048-p0.5.json"
    assert SearchSettings(max_prompt_tokens=2048, calibration_exponent=1.0).prior == line
    assert SearchSettings(max_prompt_tokens=2048).prior == root  # the default shape is the square root
    assert (
        packaged("smollm2-135m", 2048, 0.75) is None
    )  # none fitted at 0.75: no floor rather than a wrong one
    with pytest.raises(ValueError, match=r"fitted at exponent 0\.5, the calibration's is 1; give a prior"):
        SearchSettings(slope_prior=str(tmp_path / "r.json"), calibration_exponent=1.0)
    with pytest.raises(ValueError, match=r"fitted at exponent 1, the calibration at 0\.5"):
        Calibration(3.0, 5.0, 0.6, 13, (1,), 0.4, ((1, 0.3, 0.9),), exponent=0.5).floored(line, 2.0)
    floored = Calibration(3.0, 5.0, 0.6, 13, (1,), 0.4, ((1, 0.3, 0.9),), 0.9, 7.0, exponent=0.5).floored(
        root, 2.0
    )
    assert (floored.slope, floored.slope_upper, floored.slope_upper_confidence) == (5.0, 6.0, 9.0)
    assert "(bound 6.0) points per nat^0.5" in floored.floor_text()
    with pytest.raises(ValueError, match="calibration exponent = 2"):
        SearchSettings(calibration_exponent=2.0)
