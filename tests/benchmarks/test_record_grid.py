"""benchmarks/record_grid.py on a tiny random model and small open-QA files: one row per schedule and
example on both splits, datasets alternating, a rerun resumes (nothing twice, a truncated line cut)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark
from tests.tuner.data.test_openqa import _hotpot, _squad
from tuner.data.openqa import FILES


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_grid_records_both_splits_and_resumes(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "open-qa"
    data.mkdir()
    (data / FILES["hotpotqa-long"]).write_text(json.dumps(_hotpot()))
    (data / FILES["squad-long"]).write_text(json.dumps(_squad()))
    bench = load_benchmark("record_grid")
    argv = [
        "--model", str(tiny_folder), "--openqa-dir", str(data), "--n-examples", "2",
        "--max-prompt-tokens", "256", "--max-new-tokens", "4", "--split", "validation,test",
        "--out", str(tmp_path / "grid-{split}.jsonl"), "--cache", str(tmp_path / "cache"), "--chunk", "2",
    ]  # fmt: skip
    assert bench.main(argv) == 0
    table = json.loads((tmp_path / "grid-validation.schedules.json").read_text())
    assert len(table) >= 10 and {"peer-rules", "search-picks", "one-stage"} <= {
        v["family"] for v in table.values()
    }
    assert all(v["schedule"] for v in table.values())  # no peer method without --peers: the replay needs KL
    assert [n for n, v in table.items() if v["family"] == "control"] == ["keep-all (control)"]
    for split in ("validation", "test"):
        rows = _rows(tmp_path / f"grid-{split}.jsonl")
        assert len(rows) == 4 * len(table)  # 2 examples per dataset x every schedule, once each
        assert len({(r["schedule"], r["example"]) for r in rows}) == len(rows)
        assert all(r["kl_nats_per_token"] is not None and r["kl_nats_per_token"] >= 0 for r in rows)
        # the control runs the unpruned model as the schedules run: no drift from the reference
        control = [r for r in rows if r["schedule"] == "keep-all (control)"]
        assert len(control) == 4 and all(r["kl_nats_per_token"] < 1e-4 for r in control)
        assert all(r["flop_speedup"] == pytest.approx(1.0) for r in control)
        first = [r["dataset"] for r in rows if r["schedule"] == rows[0]["schedule"]]
        assert first == ["hotpotqa-long", "squad-long", "hotpotqa-long", "squad-long"]  # alternating
    val = {r["example"] for r in _rows(tmp_path / "grid-validation.jsonl")}
    assert not val & {r["example"] for r in _rows(tmp_path / "grid-test.jsonl")}
    capsys.readouterr()
    # a rerun records nothing; a run killed mid-line loses that line only, and only it is redone
    assert bench.main(argv) == 0 and "wrote 0 rows" in capsys.readouterr().out
    path = tmp_path / "grid-test.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) - 20])
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "cutting a truncated last line" in out and "wrote 1 rows" in out
    assert len(_rows(path)) == 4 * len(table)


def test_a_grid_in_another_dtype_gets_its_own_rows_file(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_benchmark("record_grid")
    assert bench.dtype_suffix("auto") == ""  # the grids recorded before the flag keep their names
    assert bench.dtype_suffix("bfloat16") == "-bfloat16"
    with pytest.raises(SystemExit):
        bench.main(["--dtype", "float8"])
    assert "invalid choice: 'float8'" in capsys.readouterr().err
