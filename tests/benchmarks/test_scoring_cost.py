"""benchmarks/scoring_cost.py on a tiny random model: a row per (method, stop rule, example), every stage
of a study timed, batched and one-at-a-time task scoring giving the same answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark, longbench_dir

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rows_and_stages_of_one_small_task(tiny_folder: Path, tmp_path: Path) -> None:
    bench = load_benchmark("scoring_cost")
    out = tmp_path / "cost.json"
    argv = ["--model", str(tiny_folder), "--task", "hotpotqa,trec", "--n-examples", "1",
            "--max-prompt-tokens", "64", "--data-dir", longbench_dir(), "--threads", "1", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["n"] == 2 and data["meta"]["layers"] == 4
    rows = data["rows"]
    # per method: both examples with the dataset's stop rule, then both without a stop string
    assert [r["method"] for r in rows] == ["baseline"] * 4 + ["paper-style"] * 4
    assert [r["stop_rule"] for r in rows[4:]][2:] == [False, False]
    assert len({r["example"] for r in rows}) == 2
    for r in rows:
        assert 0 < r["ttft_s"] <= r["total_s"] and 1 <= r["new_tokens"] <= 32
        assert r["finish_reason"] in ("stop_string", "eos", "length") and 0 <= r["score"] <= 1
    stages = data["stages"]
    assert set(stages) == {
        "build_s", "evaluator_s", "baseline_s_per_example", "fidelity_reference_s_per_example",
        "fidelity_trial_s_per_example", "task_scored_s_per_example",
        "task_scored_one_at_a_time_s_per_example", "task_scored_same_answers",
        "confirm_3_schedules_alone_s_per_example", "confirm_3_schedules_together_s_per_example",
    }  # fmt: skip
    assert all(v >= 0 for v in stages.values())
    # counted, not asserted equal: a random model's logits are near ties, which a padded batch's
    # rounding may flip (tests/lazyllm/test_batch.py checks the equality on models with margins)
    assert stages["task_scored_same_answers"] in (0, 1, 2)
