"""tuner.stats: hand-computable means, standard errors, bootstrap intervals, bounds and ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.stats import (
    Estimate,
    bootstrap_means,
    estimate,
    macro_weights,
    paired_estimate,
    ranks,
    spearman,
    standard_error,
    upper_bound_normal,
    weighted_mean,
)


def test_macro_weights_make_the_macro_average() -> None:
    groups = ["a", "a", "a", "b"]
    values = [0.0, 0.0, 3.0, 10.0]  # a: mean 1, b: 10 -> macro 5.5 (the plain mean would be 3.25)
    assert weighted_mean(values, macro_weights(groups)) == pytest.approx(5.5)
    assert sum(macro_weights(groups)) == pytest.approx(1.0)


def test_standard_error_by_hand() -> None:
    assert standard_error([2.0, 4.0]) == pytest.approx(1.0)  # stdev sqrt(2) / sqrt(2)
    assert standard_error([5.0, 5.0, 5.0]) == 0.0
    assert math.isinf(standard_error([1.0]))
    # equal weights of any size give the unweighted result
    assert standard_error([1.0, 2.0, 3.0, 4.0], [7.0] * 4) == pytest.approx(
        standard_error([1.0, 2.0, 3.0, 4.0])
    )


def test_constant_values_have_a_point_interval() -> None:
    est = estimate([1.5, 1.5, 1.5, 1.5], level=0.9)
    assert (est.value, est.low, est.high, est.upper, est.se) == (1.5, 1.5, 1.5, 1.5, 0.0)


def test_bootstrap_of_two_values_matches_the_binomial() -> None:
    """Means of n=2 resamples of {0, 1}: 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4."""
    means = bootstrap_means([0.0, 1.0], n_boot=20000, seed=3)
    counts = {v: float(np.mean(means == v)) for v in (0.0, 0.5, 1.0)}
    assert counts[0.0] == pytest.approx(0.25, abs=0.015) and counts[0.5] == pytest.approx(0.5, abs=0.015)
    est = estimate([0.0, 1.0], level=0.9, n_boot=20000, seed=3)
    assert est.low == 0.0 and est.high == 1.0 and est.upper == 1.0  # 90% one-sided: P(mean=1) = 1/4 > 10%


def test_fixed_seed_is_reproducible_and_seed_matters() -> None:
    xs = [0.1, 3.0, -2.0, 0.7, 1.1, 4.0]
    assert estimate(xs, seed=1) == estimate(xs, seed=1)
    assert estimate(xs, seed=1).low != estimate(xs, seed=2).low


def test_bootstrap_agrees_with_normal_theory_on_many_examples() -> None:
    rng = np.random.default_rng(0)
    xs = list(rng.normal(2.0, 1.0, size=400))
    est = estimate(xs, level=0.9)
    assert est.upper == pytest.approx(upper_bound_normal(xs, level=0.9), abs=0.03)
    assert est.low < est.value < est.upper < est.high


def test_paired_estimate_is_the_mean_difference() -> None:
    base = [1.0, 0.5, 0.0, 1.0]
    pruned = [1.0, 0.0, 0.0, 0.0]
    est = paired_estimate(base, pruned)
    assert est.value == pytest.approx(0.375) and est.n == 4
    assert est.se == pytest.approx(standard_error([0.0, 0.5, 0.0, 1.0]))
    with pytest.raises(ValueError, match="differ in length"):
        paired_estimate([1.0], [1.0, 2.0])


def test_estimate_round_trips_and_validates() -> None:
    est = estimate([1.0])  # one example: infinite standard error survives JSON as null
    assert est.to_dict()["se"] is None and Estimate.from_dict(est.to_dict()) == est
    with pytest.raises(ValueError, match="confidence level"):
        estimate([1.0, 2.0], level=1.0)
    with pytest.raises(ValueError, match="finite"):
        estimate([1.0, math.nan])
    with pytest.raises(ValueError, match="weights"):
        estimate([1.0, 2.0], [1.0, 0.0])


def test_ranks_and_spearman_by_hand() -> None:
    assert ranks([3.0, 1.0, 2.0]) == [3.0, 1.0, 2.0]
    assert ranks([1.0, 1.0, 1.0]) == [2.0, 2.0, 2.0]
    assert spearman([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]) == pytest.approx(1.0)
    assert spearman([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]) == pytest.approx(-1.0)
    # d = (0, 0, 1, -1): 1 - 6 * 2 / (4 * 15) = 0.8
    assert spearman([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 4.0, 3.0]) == pytest.approx(0.8)
    assert math.isnan(spearman([1.0, 2.0], [5.0, 5.0]))
