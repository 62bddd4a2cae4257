"""benchmarks/objective_noise.py on a tiny random model: per schedule one row with every example of both
splits and every signal; a rerun adds nothing; the report's tables and ``report.json``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.support import load_benchmark, longbench_dir

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rows_per_schedule_and_the_report(
    deep_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("objective_noise")
    out = tmp_path / "noise"
    names = ["keep-all", "paper-style"]
    argv = ["--model", str(deep_folder), "--max-prompt-tokens", "64", "--max-new-tokens", "3",
            "--n-examples", "1", "--data-dir", longbench_dir(), "--schedules", ";".join(names),
            "--threads", "1", "--out", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [r["schedule"] for r in rows] == names
    splits = {e["split"] for r in rows for e in r["examples"]}
    assert splits == {"validation", "test"}
    keys = [e["key"] for e in rows[0]["examples"]]
    for r in rows:
        assert [e["key"] for e in r["examples"]] == keys and r["max_prompt_tokens"] == 64
        assert r["flop_speedup"] >= 1.0 and r["revival"] == "frozen"
        for e in r["examples"]:
            assert e["kl"] >= 0 and 0 <= e["1-top1"] <= 1 and -100 <= e["score"] <= 100
            assert e["cpu_score"] >= 0 and e["cpu_fidelity"] >= 0
    keep_all = rows[0]
    assert keep_all["flop_speedup"] == 1.0
    assert all(e["kl"] < 1e-6 and e["score"] == 0 for e in keep_all["examples"])
    assert any(e["kl"] > 0 for e in rows[1]["examples"])  # paper-style drifts
    report = json.loads((out / "report.json").read_text())
    assert (report["n_schedules"], report["n_examples"]) == (2, len(keys))
    assert set(report["signals"]) <= set(bench.SIGNALS) and "kl" in report["signals"]
    for s in report["signals"].values():
        assert s["cpu_s_per_example"] >= 0 and (math.isnan(s["validity"]) or -1 <= s["validity"] <= 1)
    capsys.readouterr()
    # a rerun finds every schedule done and only reports
    assert bench.main(argv) == 0
    assert len((out / "rows.jsonl").read_text().splitlines()) == 2
    assert "| schedule | FLOP speedup |" in capsys.readouterr().out
