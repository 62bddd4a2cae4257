"""Uncertainty of per-example averages: mean, standard error, bootstrap intervals, one-sided bounds.

Every accuracy number of a study is an average over examples, usually a **macro** average (each
dataset weighs the same however many examples it has). Here such an average is a weighted mean
``m = sum(w_i x_i) / sum(w_i)`` with fixed per-example weights (``macro_weights``), and:

* the standard error is the usual one of a weighted mean,
  ``se = sqrt(n / (n - 1) * sum((w_i / W)^2 (x_i - m)^2))``, which for equal weights is
  ``stdev(x) / sqrt(n)``;
* the bootstrap resamples *examples* (not datasets) ``n_boot`` times with a fixed seed and recomputes
  the weighted mean of each resample, so datasets with a single example still contribute variance;
* a **paired** comparison (schedule vs baseline, or schedule A vs B on the same examples) bootstraps
  the per-example differences, which cancels how hard each example is;
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


def bootstrap_means(
    values: Sequence[float],
    weights: Sequence[float] | None = None,
    *,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
) -> np.ndarray:
    """``[n_boot]`` weighted means of examples resampled with replacement (fixed ``seed``)."""
    x, w = _arrays(values, weights)
    if n_boot < 1:
        raise ValueError(f"n_boot = {n_boot}: must be >= 1")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.shape[0], size=(n_boot, x.shape[0]))  # [n_boot, n]
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
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
) -> Estimate:
    """Mean, standard error, two-sided interval and one-sided upper bound of ``values``."""
    check_level(level)
    means = bootstrap_means(values, weights, n_boot=n_boot, seed=seed)
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
    reference: Sequence[float],
    other: Sequence[float],
    weights: Sequence[float] | None = None,
    *,
    level: float = DEFAULT_LEVEL,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
) -> Estimate:
    """The mean of ``reference[i] - other[i]`` with its uncertainty (examples resampled as pairs).

    With ``reference`` the baseline's per-example scores and ``other`` a schedule's, this is the
    accuracy loss; a positive value means the schedule scores lower.
    """
    if len(reference) != len(other):
        raise ValueError(f"paired lists differ in length ({len(reference)} vs {len(other)})")
    diffs = [a - b for a, b in zip(reference, other)]
    return estimate(diffs, weights, level=level, n_boot=n_boot, seed=seed)


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
