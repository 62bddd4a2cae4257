"""tuner.statistics.bootstrap: hand-computable means, standard errors, bootstrap intervals, bounds and ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.statistics.bootstrap import (
    Estimate,
    bootstrap_means,
    estimate,
    macro_weights,
    paired_estimate,
    ranks,
    resample_indices,
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


# The one paired bootstrap (issue 18): coverage, strata, sign, level --------------------------------
def _simulated_pair(
    rng: np.random.Generator, sizes: dict[str, int]
) -> tuple[list[float], list[float], list[str]]:
    """Baseline and method scores per example; dataset d's true loss is ``LOSS[d]`` points."""
    base: list[float] = []
    method: list[float] = []
    groups: list[str] = []
    for d, n in sizes.items():
        difficulty = rng.normal(50.0, 20.0, size=n)  # shared by both sides: the pairing cancels it
        base += list(difficulty)
        method += list(difficulty - LOSS[d] + rng.normal(0.0, 4.0, size=n))
        groups += [d] * n
    return base, method, groups


LOSS = {"a": 1.0, "b": 3.0}
TRUE_MACRO_LOSS = 2.0  # the mean of the per-dataset losses


@pytest.mark.parametrize("stratified", [False, True])
@pytest.mark.parametrize("level", [0.8, 0.95])
def test_interval_covers_the_true_loss_at_the_nominal_rate(stratified: bool, level: float) -> None:
    rng = np.random.default_rng(2026)
    trials, hits = 300, 0
    for t in range(trials):
        base, method, groups = _simulated_pair(rng, {"a": 30, "b": 12})
        est = paired_estimate(
            base, method, macro_weights(groups), strata=groups if stratified else None,
            level=level, n_boot=400, seed=t,
        )  # fmt: skip
        hits += est.low <= TRUE_MACRO_LOSS <= est.high
    # binomial sd at p=0.8, n=300 is 0.023; percentile intervals run a little narrow at these sizes
    assert level - 0.07 <= hits / trials <= level + 0.04


def test_a_stratified_resample_never_mixes_datasets() -> None:
    strata = ["a"] * 5 + ["b"] * 2 + ["c"] + ["a"] * 3
    idx = resample_indices(len(strata), strata, n_boot=500, seed=1)
    assert idx.shape == (500, len(strata))
    labels = np.array(strata)
    assert (labels[idx] == labels[None, :]).all()  # every position drew from its own dataset
    assert (idx[:, 7] == 7).all()  # a dataset of one example always draws that example
    # without strata positions draw from anywhere: resamples do mix datasets
    free = resample_indices(len(strata), None, n_boot=500, seed=1)
    assert (labels[free] != labels[None, :]).any()
    with pytest.raises(ValueError, match="one label per example"):
        resample_indices(3, ["a", "b"])


def test_stratified_bootstrap_is_the_macro_mean_of_each_dataset_resample() -> None:
    """With macro weights and strata, each draw is the mean over datasets of the per-dataset means (the
    statistic tuner.evaluation.matched's own bootstrap used to compute)."""
    values = [0.0, 1.0, 0.0, 1.0, 0.5, 0.25, 2.0]
    groups = ["a", "a", "a", "a", "b", "b", "c"]
    idx = resample_indices(len(values), groups, n_boot=50, seed=4)
    x, g = np.array(values), np.array(groups)
    by_hand = np.mean([x[idx][:, g == d].mean(axis=1) for d in ("a", "b", "c")], axis=0)
    means = bootstrap_means(values, macro_weights(groups), strata=groups, n_boot=50, seed=4)
    np.testing.assert_allclose(means, by_hand)


def test_loss_sign_is_baseline_minus_method() -> None:
    base = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    worse = [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    est = paired_estimate(base, worse)
    assert est.value == pytest.approx(2 / 6) and est.value > 0 and est.low >= 0  # worse = positive loss
    assert paired_estimate(worse, base).value == pytest.approx(-2 / 6)  # better = negative loss


def test_level_is_honoured() -> None:
    rng = np.random.default_rng(5)
    base, method, groups = _simulated_pair(rng, {"a": 20, "b": 20})
    w = macro_weights(groups)
    narrow = paired_estimate(base, method, w, level=0.5)
    wide = paired_estimate(base, method, w, level=0.95)
    assert (narrow.level, wide.level) == (0.5, 0.95)
    assert wide.low < narrow.low < narrow.high < wide.high  # same draws: nested quantiles
    diffs = [a - b for a, b in zip(base, method)]
    means = bootstrap_means(diffs, w)
    assert wide.high == pytest.approx(float(np.quantile(means, 0.975)))
    assert wide.upper == pytest.approx(float(np.quantile(means, 0.95)))
