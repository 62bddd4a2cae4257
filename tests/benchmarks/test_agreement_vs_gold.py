"""benchmarks/agreement_vs_gold.py: each schedule's gold and agreement loss from grid rows, with the
product's metrics, and the line that maps a gold budget to agreement points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark


def _row(schedule: str, i: int, prediction: str, baseline: str) -> dict[str, object]:
    return {
        "schedule": schedule, "example": f"d{i % 2}/q{i}", "dataset": f"d{i % 2}", "prediction": prediction,
        "baseline_prediction": baseline, "answers": ["paris"], "kl_nats_per_token": 0.1 if schedule != "same" else 0.0,
    }  # fmt: skip


def test_losses_and_the_line_from_grid_rows(tmp_path: Path) -> None:
    bench = load_benchmark("agreement_vs_gold")
    rows = []
    for i in range(40):
        right = "paris" if i % 4 else "rome"  # the unpruned model is right on 30 of 40
        rows.append(_row("same", i, right, right))  # the unpruned answers again: no loss of either kind
        rows.append(_row("reworded", i, f"it is {right}", right))  # as right as before, worded otherwise
        rows.append(_row("wrong", i, "berlin", right))  # every answer changed and wrong
    path = tmp_path / "grid-x-validation-1024.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.main(["--rows", str(path), "--out", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out.json").read_text())
    by = {r["schedule"]: r for r in data["schedules"]}
    assert by["same"]["gold"]["value"] == 0 and by["same"]["agreement"]["value"] == 0
    reworded = by["reworded"]
    assert reworded["agreement"]["value"] == pytest.approx(50.0)  # qa_f1 of "it is X" against "X": 1/2
    assert reworded["gold"]["value"] == pytest.approx(0.75 * 50.0)  # only the right answers lose
    assert by["wrong"]["gold"]["value"] == pytest.approx(75.0) and by["wrong"]["agreement"]["value"] == 100.0
    (line,) = data["mappings"]
    gold = [by[s]["gold"]["value"] for s in ("same", "reworded", "wrong")]
    agree = [by[s]["agreement"]["value"] for s in ("same", "reworded", "wrong")]
    import numpy as np

    slope, intercept = np.polyfit(gold, agree, 1)
    assert line["agreement_budget"] == pytest.approx(intercept + slope * 2.0)
    assert line["low"] <= line["agreement_budget"] <= line["high"] and line["n_examples"] == 40
