"""The calibration's shape: task loss proportional to ``KL^p`` through the origin, ``0 < p <= 1``.

Kept apart from :mod:`tuner.statistics.calibration` (which fits it) and :mod:`tuner.statistics.prior`
(which stores a slope fitted at one shape) so that both read it from below."""

from __future__ import annotations

LINEAR = 1.0
"""The straight line: task loss proportional to KL (this module's functions' default shape)."""
SQUARE_ROOT = 0.5
"""A study's default shape (:attr:`tuner.study.settings.SearchSettings.calibration_exponent`): on the
recorded open-QA grids' validation examples a straight line under-predicts what the schedules
drifting least lose, and a budget's picks are among them (docs/statistics.md#small-drifts-cost-more-both-presets-on-the-square-root)."""


def check_exponent(exponent: float) -> float:
    """``exponent`` if it is a shape the calibration can fit (``0 < p <= 1``: concave or straight through
    the origin), else one ``ValueError`` line."""
    if isinstance(exponent, bool) or not isinstance(exponent, (int, float)) or not 0 < exponent <= 1:
        raise ValueError(
            f"calibration exponent = {exponent!r}: must be a number in (0, 1] (1: task loss proportional to KL; "
            "0.5: to its square root)"
        )
    return float(exponent)


def slope_unit(exponent: float) -> str:
    """The unit of a slope at ``exponent``: ``points per nat`` (1) or ``points per nat^0.5``."""
    return "points per nat" if exponent == LINEAR else f"points per nat^{exponent:g}"
