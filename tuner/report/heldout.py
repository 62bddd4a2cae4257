"""The held-out check in words: each paired comparison as one sentence, and ``heldout.json``'s content."""

from __future__ import annotations

from typing import Any

from tuner.stages.heldout import Comparison, HeldoutReport


def verdict(c: Comparison) -> str:
    """One sentence comparing two schedules' test losses on the same examples."""
    diff = c.difference
    span = f"({diff.level:.0%} interval {diff.low:+.2f} to {diff.high:+.2f}, n={diff.n})"
    if not c.told_apart:
        return (
            f"{c.label} and {c.other} cannot be told apart on test accuracy: loss difference "
            f"{diff.value:+.2f} score points {span}"
        )
    better = c.label if diff.value < 0 else c.other
    return f"{better} loses less on test: loss difference ({c.label} - {c.other}) {diff.value:+.2f} score points {span}"


def heldout_json(report: HeldoutReport) -> dict[str, Any]:
    """``heldout.json``: the report's data and its verdicts in words."""
    return report.to_dict() | {"verdicts": [verdict(c) for c in report.comparisons]}
