"""benchmarks/scoring_ablation.py: the report shows the signals the rows carry (KL and top-1 alone
with --kl-only), and its paired differences read B - A on the same examples."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import load_benchmark


def _cell(structure: str, rule: str, kl: float, loss: float | None) -> dict[str, Any]:
    rows = []
    for split in ("validation", "test"):
        for i in range(6):
            row: dict[str, Any] = {
                "split": split,
                "dataset": f"d{i % 2}",
                "key": f"q{i}",
                "kl": kl + 0.01 * i,
                "top1": 0.9,
            }
            if loss is not None:
                row["loss"] = loss + i
            rows.append(row)
    return {
        "target": 1.4, "structure": structure, "rule": rule, "scoring": rule, "keep": 0.5,
        "percentiles": [], "flop_speedup": 1.4, "rows": rows,
    }  # fmt: skip


def _result(loss: float | None) -> dict[str, Any]:
    cells = [
        _cell("one-stage", "last", 0.30, loss),
        _cell("one-stage", "fastkv", 0.10, loss),
        _cell("gradual", "last", 0.20, loss),
        _cell("gradual", "fastkv", 0.10, loss),
    ]
    return {"model": "m", "task": "openqa", "max_prompt_tokens": 1024, "median_prompt_tokens": 1000,
            "revival": "frozen", "level": 0.9, "cells": cells}  # fmt: skip


@pytest.mark.parametrize("with_loss", [True, False])
def test_the_report_shows_the_signals_the_rows_carry(with_loss: bool) -> None:
    bench = load_benchmark("scoring_ablation")
    text = bench.markdown(_result(1.0 if with_loss else None))
    assert "task openqa" in text
    header = next(line for line in text.splitlines() if line.startswith("| structure |"))
    assert ("task loss (points)" in header) is with_loss
    assert "KL (nats)" in header and "top-1 agreement" in header
    assert ("task loss in LongBench points" in text) is with_loss
    # fastkv - last on one-stage: every example's KL is 0.20 lower, an interval of a point
    paired = next(line for line in text.splitlines() if line.startswith("| one-stage: fastkv - last |"))
    assert "-0.200 [-0.200, -0.200] (fastkv better)" in paired
    assert paired.count("|") == (5 if with_loss else 4)
