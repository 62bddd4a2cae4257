"""Uncertainty of per-example averages: mean, standard error, bootstrap intervals, one-sided bounds.

This module holds the **one** bootstrap of the project: every interval of every report (the
search's constraint, confirmation, the held-out check, ``tuner.evaluate``'s Table 3 and its
matched-speed report, the benchmarks) comes from :func:`estimate` / :func:`paired_estimate`.

Every accuracy number of a study is an average over examples, usually a **macro** average (each
dataset weighs the same however many examples it has). Here such an average is a weighted mean
``m = sum(w_i x_i) / sum(w_i)`` with fixed per-example weights (``macro_weights``), and:

* the standard error is the usual one of a weighted mean,
  ``se = sqrt(n / (n - 1) * sum((w_i / W)^2 (x_i - m)^2))``, which for equal weights is
  ``stdev(x) / sqrt(n)``;
* the bootstrap resamples *examples* ``n_boot`` times with a fixed seed and recomputes the weighted
  mean of each resample. Two options say how (:func:`resample_indices`):

  - ``strata=None`` (the default): any example can fill any position, so datasets with a single
    example still contribute variance;
  - ``strata=[dataset of each example]``: each position draws only from its own dataset, so every
    resample keeps each dataset's size and never mixes datasets;

* a **paired** comparison bootstraps the per-example differences (the same draw for both sides),
  which cancels how hard each example is. The sign convention is one: **loss = baseline - method**,
  so a method that scores below its baseline has a *positive* loss;
* the two-sided interval at ``level`` is the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of
  the bootstrap means, the one-sided upper bound the ``level`` quantile ("with ``level`` confidence
  the true loss is at most this").

Quantiles use linear interpolation between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

DEFAULT_LEVEL = 0.9
DEFAULT_N_BOOT = 2000
DEFAULT_SEED = 0


def check_level(level: float) -> None:
    if not 0.5 <= level < 1.0:
        raise ValueError(f"confidence level = {level}: must be in [0.5, 1) (e.g. 0.9)")


def macro_weights(groups: Sequence[str]) -> list[float]:
    """Per-example weights that make a weighted mean the macro average over ``groups``.

    >>> macro_weights(["a", "a", "b"])
    [0.25, 0.25, 0.5]
    """
    if not groups:
        raise ValueError("no examples: need at least one group label")
    counts: dict[str, int] = {}
    for g in groups:
        counts[g] = counts.get(g, 0) + 1
    return [1.0 / (counts[g] * len(counts)) for g in groups]


def weighted_mean(values: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """``sum(w x) / sum(w)`` (plain mean without weights)."""
    x, w = _arrays(values, weights)
    return float(np.dot(w, x) / w.sum())


def standard_error(values: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """Standard error of the weighted mean; ``inf`` for a single example (no spread to estimate).

    >>> round(standard_error([1.0, 2.0, 3.0, 4.0]), 6)   # stdev 1.290994 / sqrt(4)
    0.645497
    """
    x, w = _arrays(values, weights)
    n = x.shape[0]
    if n < 2:
        return math.inf
    m = float(np.dot(w, x) / w.sum())
    share = w / w.sum()
    return float(math.sqrt(n / (n - 1) * float(np.sum(share**2 * (x - m) ** 2))))


def resample_indices(
    n: int, strata: Sequence[str] | None = None, *, n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED
) -> np.ndarray:
    """``[n_boot, n]`` bootstrap draws: row ``b``, column ``j`` is the example that fills position ``j``.

    Without ``strata`` any example fills any position. With ``strata`` (one label per example, e.g. its
    dataset) position ``j`` draws only from the examples of ``strata[j]``: each stratum keeps its size.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot = {n_boot}: must be >= 1")
    if n < 1:
        raise ValueError(f"n = {n}: need at least one example to resample")
    rng = np.random.default_rng(seed)
    if strata is None:
        return rng.integers(0, n, size=(n_boot, n))
    if len(strata) != n:
        raise ValueError(f"{len(strata)} strata labels for {n} examples: give one label per example")
    idx = np.empty((n_boot, n), dtype=np.int64)
    for label in dict.fromkeys(strata):  # first-appearance order: the same draws for the same input
        members = np.array([i for i, s in enumerate(strata) if s == label])
        idx[:, members] = members[rng.integers(0, members.size, size=(n_boot, members.size))]
    return idx


def bootstrap_means(
    values: Sequence[float],
    weights: Sequence[float] | None = None,
    *,
    strata: Sequence[str] | None = None,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
) -> np.ndarray:
    """``[n_boot]`` weighted means of examples resampled with replacement (fixed ``seed``; ``strata``
    as in :func:`resample_indices`)."""
    x, w = _arrays(values, weights)
    idx = resample_indices(x.shape[0], strata, n_boot=n_boot, seed=seed)  # [n_boot, n]
    ws = w[idx]
    return np.asarray((ws * x[idx]).sum(axis=1) / ws.sum(axis=1))


@dataclass(frozen=True)
class Estimate:
    """A mean with its uncertainty.

    Attributes:
        value: the (weighted) mean over the examples.
        se: its standard error (``inf`` with one example).
        low, high: two-sided bootstrap interval at ``level``.
        upper: one-sided bootstrap upper bound at ``level``.
        level: confidence level, e.g. 0.9.
        n: number of examples.
    """

    value: float
    se: float
    low: float
    high: float
    upper: float
    level: float
    n: int

    def __post_init__(self) -> None:
        check_level(self.level)
        if self.n < 1:
            raise ValueError(f"n = {self.n}: an estimate needs at least one example")
        if not self.low <= self.high:
            raise ValueError(f"interval [{self.low}, {self.high}] is reversed")

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    def to_dict(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(self).items()
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Estimate:
        se = data.get("se")
        return cls(
            value=float(data["value"]),
            se=math.inf if se is None else float(se),
            low=float(data["low"]),
            high=float(data["high"]),
            upper=float(data["upper"]),
            level=float(data["level"]),
            n=int(data["n"]),
        )

    def text(self, digits: int = 2) -> str:
        """``"1.23 (90% interval -0.40 to 2.90, n=13)"``."""
        return (
            f"{self.value:.{digits}f} ({self.level:.0%} interval {self.low:.{digits}f} to "
            f"{self.high:.{digits}f}, n={self.n})"
        )


def estimate(
    values: Sequence[float],
    weights: Sequence[float] | None = None,
    *,
    strata: Sequence[str] | None = None,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
) -> Estimate:
    """Mean, standard error, two-sided interval and one-sided upper bound of ``values``.

    Args:
        values: one number per example.
        weights: per-example weights (``macro_weights(datasets)`` for a macro average; None: equal).
        strata: one label per example to resample within (None: resample across all examples).
        level: confidence level of the interval and of the one-sided bound, in [0.5, 1).
        n_boot, seed: bootstrap draws and their seed.
    """
    check_level(level)
    means = bootstrap_means(values, weights, strata=strata, n_boot=n_boot, seed=seed)
    lo, hi, up = np.quantile(means, [(1 - level) / 2, (1 + level) / 2, level])
    return Estimate(
        value=weighted_mean(values, weights),
        se=standard_error(values, weights),
        low=float(lo),
        high=float(hi),
        upper=float(up),
        level=level,
        n=len(values),
    )


def paired_estimate(
    baseline: Sequence[float],
    method: Sequence[float],
    weights: Sequence[float] | None = None,
    *,
    strata: Sequence[str] | None = None,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
) -> Estimate:
    """The paired bootstrap: the loss ``mean(baseline[i] - method[i])`` with its uncertainty.

    Examples are resampled as pairs (the same draw for both sides). **Sign**: positive = the method
    scores below the baseline (worse); this is the one convention of every report. ``weights`` and
    ``strata`` as in :func:`estimate`.

    >>> paired_estimate([1.0, 1.0], [0.0, 1.0]).value   # the method lost one of two points
    0.5
    """
    if len(baseline) != len(method):
        raise ValueError(f"paired lists differ in length ({len(baseline)} vs {len(method)})")
    diffs = [a - b for a, b in zip(baseline, method)]
    return estimate(diffs, weights, strata=strata, level=level, n_boot=n_boot, seed=seed)


def upper_bound_normal(
    values: Sequence[float], weights: Sequence[float] | None = None, *, level: float
) -> float:
    """One-sided normal-theory upper bound ``mean + z_level * se`` (a cross-check of the bootstrap).

    >>> round(upper_bound_normal([1.0, 2.0, 3.0, 4.0], level=0.9), 4)   # 2.5 + 1.2816 * 0.6455
    3.3272
    """
    check_level(level)
    from statistics import NormalDist

    return weighted_mean(values, weights) + NormalDist().inv_cdf(level) * standard_error(values, weights)


def _arrays(values: Sequence[float], weights: Sequence[float] | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.shape[0] == 0:
        raise ValueError("need a non-empty list of per-example values")
    if not np.all(np.isfinite(x)):
        raise ValueError("per-example values must be finite")
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != x.shape:
        raise ValueError(f"{w.shape[0]} weights for {x.shape[0]} values")
    if np.any(w <= 0) or not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite and > 0")
    return x, w


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank.

    >>> ranks([10.0, 30.0, 20.0, 20.0])
    [1.0, 4.0, 2.5, 2.5]
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson correlation of the tie-averaged ranks); nan if one side is constant.

    >>> spearman([1.0, 2.0, 3.0], [10.0, 30.0, 20.0])
    0.5
    """
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("spearman needs two equally long lists of at least 2 values")
    rx, ry = np.asarray(ranks(x)), np.asarray(ranks(y))
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denom = math.sqrt(float((dx**2).sum() * (dy**2).sum()))
    return float((dx * dy).sum() / denom) if denom > 0 else math.nan
