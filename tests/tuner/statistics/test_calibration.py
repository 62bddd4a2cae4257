"""tuner.statistics.calibration: the pooled slope of task loss on KL, its bound, the constraint and the power statement."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tuner.statistics.bootstrap import macro_weights
from tuner.statistics.calibration import Calibration, ScoredSchedule, fit
from tuner.statistics.shape import check_exponent


def _simulate(
    slope: float, n: int, kls: list[float], noise: float, seed: int
) -> tuple[list[ScoredSchedule], dict[str, float]]:
    rng = np.random.default_rng(seed)
    keys = [f"{'ab'[i % 2]}/{i}" for i in range(n)]
    hardness = rng.gamma(2.0, 0.5, size=n)  # some examples drift more under every schedule
    scored = []
    for s, k in enumerate(kls):
        kl = k * hardness
        task = slope * kl + rng.normal(0.0, noise, size=n)
        scored.append(ScoredSchedule(s, dict(zip(keys, kl.tolist())), dict(zip(keys, task.tolist()))))
    return scored, dict(zip(keys, macro_weights([k[0] for k in keys])))


def test_slope_is_recovered_and_the_bound_covers_it_at_the_level() -> None:
    covered = 0
    runs = 200
    for seed in range(runs):
        scored, weights = _simulate(8.0, 13, [0.05, 0.1, 0.2], noise=10.0, seed=seed)
        cal = fit(scored, weights, level=0.9, n_boot=400, seed=seed)
        assert cal is not None and cal.slope_upper >= cal.slope
        covered += cal.slope_upper >= 8.0
    assert 0.84 <= covered / runs <= 0.97  # one-sided 90%: about 9 in 10 bounds lie above the truth
    scored, weights = _simulate(8.0, 400, [0.05, 0.1, 0.2], noise=1.0, seed=1)
    cal = fit(scored, weights, level=0.9)
    assert cal is not None and cal.slope == pytest.approx(8.0, rel=0.05)


def test_constraint_is_the_budget_over_the_bound_never_past_the_evidence() -> None:
    scored, weights = _simulate(8.0, 200, [0.05, 0.1, 0.2], noise=1.0, seed=2)
    cal = fit(scored, weights, level=0.9)
    assert cal is not None
    assert cal.max_kl(1.0) == pytest.approx(1.0 / cal.slope_upper)
    assert cal.max_kl(100.0) == cal.max_scored_kl  # 100 / 8 nats would extrapolate far past 0.2
    est, up = cal.predicted(0.1)
    assert est == pytest.approx(cal.slope * 0.1) and up == pytest.approx(cal.slope_upper * 0.1)
    assert cal.examples_to_certify(0.1, est - 0.01) is None  # the estimate itself is over budget
    assert cal.examples_to_certify(0.1, up + 0.01) == cal.n_examples  # already certified
    need = cal.examples_to_certify(0.1, (est + up) / 2)
    assert need is not None and need == pytest.approx(4 * cal.n_examples, rel=0.01)  # half the gap: 4x n


def test_no_drift_no_slope_and_mismatched_evidence_is_refused() -> None:
    zero = ScoredSchedule(0, {"a/1": 0.0}, {"a/1": 0.0})
    assert fit([zero], {"a/1": 1.0}, level=0.9) is None
    with pytest.raises(ValueError, match="different examples"):
        ScoredSchedule(1, {"a/1": 0.1}, {"a/2": 0.0})


def test_the_largest_scored_schedule_is_covered_whatever_order_its_mean_was_summed_in() -> None:
    """Defect (seed 0 of the default study): the fastest scored schedule's own mean KL came out 2 ulps
    above the calibration's (0.24911967902254475 > ...473), so it was 'past the largest scored KL'
    and the recommendation fell back to a slower one."""
    scored, weights = _simulate(8.0, 13, [0.05, 0.1, 0.24911967902254473], noise=1.0, seed=3)
    cal = fit(scored, weights, level=0.9)
    assert cal is not None
    top = cal.max_scored_kl
    assert cal.covers(top) and cal.covers(float(np.nextafter(np.nextafter(top, 1.0), 1.0)))
    assert not cal.covers(top * 1.001)  # past the evidence is still past it
    assert cal.covers(0.0)


def test_the_bound_at_the_confidence_comes_from_the_same_bootstrap_and_is_stored() -> None:
    """The recommendation is chosen at --decision-level (0.6) and reported at --confidence (0.9) too."""
    scored, weights = _simulate(8.0, 13, [0.05, 0.1, 0.2], noise=10.0, seed=4)
    low = fit(scored, weights, level=0.6)
    cal = fit(scored, weights, level=0.6, confidence=0.9)
    assert low is not None and cal is not None and low.slope_upper_confidence is None
    assert cal.slope_upper == low.slope_upper  # the deciding bound does not move
    assert cal.confidence == 0.9 and cal.slope_upper_confidence is not None
    assert cal.slope_upper_confidence > cal.slope_upper  # a higher quantile of the same resamples
    at90 = fit(scored, weights, level=0.9)
    assert at90 is not None and cal.slope_upper_confidence == pytest.approx(at90.slope_upper)
    assert cal.upper_at_confidence(0.1) == pytest.approx(cal.slope_upper_confidence * 0.1)
    assert (
        low.upper_at_confidence(0.1) is None and low.examples_to_certify(0.1, 1.0, at_confidence=True) is None
    )
    assert Calibration.from_dict(cal.to_dict()) == cal
    old = {k: v for k, v in cal.to_dict().items() if k not in ("confidence", "slope_upper_confidence")}
    assert Calibration.from_dict(old) == low  # a calibration stored before the second level loads
    with pytest.raises(ValueError, match="both or neither"):
        Calibration(8.0, 10.0, 0.6, 13, (1,), 0.2, ((1, 0.2, 1.6),), confidence=0.9)


def test_a_measured_gain_is_no_evidence_of_one() -> None:
    """Seed 1 of the default study: slope -4.9 at 0.6 (bound -2.4), 7.7 at 0.9; trial 41 at KL 0.299."""
    cal = Calibration(-4.94, -2.43, 0.6, 13, (41,), 0.299, ((41, 0.299, -1.29),), 0.9, 7.71)
    assert cal.upper_at_confidence(0.299) == pytest.approx(2.305, abs=1e-3)
    # the estimate -1.48 counts as 0: 13 * (2.305 / 2)^2 = 17.3 -> 18 examples, not 13 * (3.78 / 3.48)^2
    assert cal.examples_to_certify(0.299, 2.0, at_confidence=True) == 18
    assert cal.examples_to_certify(0.299, 2.0) == 13  # at the decision level it is certified
    negative = Calibration(-4.94, -2.43, 0.6, 13, (41,), 0.299, ((41, 0.299, -1.29),), 0.9, -1.0)
    assert negative.upper_at_confidence(0.299) == 0.0  # no cost even at 90%, not a gain


def _simulate_concave(
    slope: float, n: int, kls: list[float], seed: int
) -> tuple[list[ScoredSchedule], dict[str, float]]:
    """Task loss = slope x sqrt(KL) per schedule, on top of per-example noise that averages out."""
    rng = np.random.default_rng(seed)
    keys = [f"{'ab'[i % 2]}/{i}" for i in range(n)]
    scored = []
    for s, k in enumerate(kls):
        kl = np.full(n, k) * rng.uniform(0.5, 1.5, size=n)
        kl *= k / float(kl.mean())  # the mean KL is exactly k on every example set
        task = np.full(n, slope * k**0.5) + rng.normal(0.0, 1.0, size=n)
        task += slope * k**0.5 - float(task.mean())
        scored.append(ScoredSchedule(s, dict(zip(keys, kl.tolist())), dict(zip(keys, task.tolist()))))
    return scored, {k: 1.0 for k in keys}


def test_a_concave_calibration_fits_the_square_root_and_inverts_it_for_the_cap() -> None:
    scored, weights = _simulate_concave(6.0, 200, [0.01, 0.09, 0.25], seed=3)
    cal = fit(scored, weights, level=0.9, exponent=0.5)
    assert cal is not None and cal.exponent == 0.5 and cal.unit == "points per nat^0.5"
    assert cal.slope == pytest.approx(6.0, rel=1e-9)  # sum T / sum sqrt(K) on exact means
    assert 6.0 < cal.slope_upper < 6.5  # resampled at the same shape: the bound sits just above it
    est, up = cal.predicted(0.04)
    assert est == pytest.approx(6.0 * 0.2) and up == pytest.approx(cal.slope_upper * 0.2)
    assert cal.max_kl(1.0) == pytest.approx((1.0 / cal.slope_upper) ** 2)
    assert cal.upper_at_confidence(0.04) is None and cal.predicted(0.0) == (0.0, 0.0)
    line = fit(scored, weights, level=0.9)
    assert line is not None and line.exponent == 1.0 and line.unit == "points per nat"
    # the straight line through the same points under-predicts the slow schedule, the square root does not
    assert line.predicted(0.01)[0] < 0.5 * 6.0 * 0.1 and cal.predicted(0.01)[0] == pytest.approx(0.6)
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    stored_before = {k: v for k, v in line.to_dict().items() if k != "exponent"}
    assert Calibration.from_dict(stored_before).exponent == 1.0


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, True, "0.5", float("nan")])
def test_an_exponent_outside_zero_to_one_is_one_line(bad: object) -> None:
    with pytest.raises(ValueError, match=r"calibration exponent = .*: must be a number in \(0, 1\]"):
        check_exponent(bad)  # type: ignore[arg-type]
    scored, weights = _simulate_concave(6.0, 20, [0.1], seed=0)
    with pytest.raises(ValueError, match="calibration exponent"):
        fit(scored, weights, level=0.9, exponent=bad)  # type: ignore[arg-type]


def test_a_kl_measured_on_a_sample_widens_the_bound_in_quadrature() -> None:
    """The bound at --confidence of a schedule whose KL is a sample mean: the slope's error and the
    KL's add in quadrature around the estimate, never below the bound of the KL read as exact."""
    cal = Calibration(
        10.0, 12.0, 0.6, 200, (1,), 0.3, ((1, 0.3, 3.0),), confidence=0.9, slope_upper_confidence=20.0
    )
    assert cal.upper_with_kl_error(0.1, None) == cal.upper_at_confidence(0.1) == pytest.approx(2.0)
    assert cal.upper_with_kl_error(0.1, 0.1) == pytest.approx(2.0)  # a KL with no error
    # estimate 1.0; the slope adds 1.0 (2.0 - 1.0), the KL 10 x 0.05 = 0.5: 1 + sqrt(1 + 0.25)
    assert cal.upper_with_kl_error(0.1, 0.15) == pytest.approx(1.0 + math.hypot(1.0, 0.5))
    bounds = [cal.upper_with_kl_error(0.1, up) or 0.0 for up in (0.1, 0.12, 0.15, 0.3)]
    assert bounds == sorted(bounds) and bounds[-1] > bounds[0] > 0
    # a calibration that measured no cost: the KL's error moves no prediction, the slope's bound stays
    none = Calibration(
        -3.0, 5.0, 0.6, 13, (1,), 0.3, ((1, 0.3, -0.9),), confidence=0.9, slope_upper_confidence=40.0
    )
    assert none.upper_with_kl_error(0.05, 0.5) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"KL bound 0\.05 below its mean 0\.1"):
        cal.upper_with_kl_error(0.1, 0.05)
    unrecorded = Calibration(10.0, 12.0, 0.6, 200, (1,), 0.3, ((1, 0.3, 3.0),))
    assert unrecorded.upper_with_kl_error(0.1, 0.15) is None
