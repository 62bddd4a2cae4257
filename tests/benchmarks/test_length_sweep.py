"""benchmarks/length_sweep.py on a tiny random model: a row per length with both speedups and the share
computed, appended as it goes; a rerun resumes (no length measured twice); the plot is drawn."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import load_benchmark, longbench_dir

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("LONGBENCH_DIR", longbench_dir())
    return load_benchmark("length_sweep")


def test_a_row_per_length_appended_and_resumed(bench: ModuleType, deep_folder: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "rows.jsonl", tmp_path / "speedup.png"
    argv = ["--model", str(deep_folder), "--lengths", "32", "64", "--rounds", "1", "--new-tokens", "3",
            "--clock", "wall", "--out", str(out), "--plot", str(png)]  # fmt: skip
    first = [
        "--model",
        str(deep_folder),
        "--lengths",
        "32",
        "--rounds",
        "1",
        "--new-tokens",
        "3",
        "--clock",
        "wall",
    ]
    assert bench.main([*first, "--out", str(out)]) == 0  # 32 tokens only
    assert [json.loads(line)["tokens"] for line in out.read_text().splitlines()] == [32]
    assert bench.main(argv) == 0  # resumes: measures 64, keeps 32
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["tokens"] for r in rows] == [32, 64]
    for r in rows:
        assert r["ttft_speedup"] > 0 and r["total_speedup"] > 0 and r["flop_speedup"] > 1
        assert 0 < r["prompt_computed_pct"] < 100  # the paper-style schedule prunes every prompt
        assert (r["rounds"], r["new_tokens"]) == (1, 3)
    assert png.stat().st_size > 0


def test_schedules_share_a_rows_file_and_the_plot(
    bench: ModuleType, deep_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two schedules in one file: each resumes on its own key, carries its --label, and both are drawn."""
    out, png = tmp_path / "rows.jsonl", tmp_path / "speedup.png"
    common = ["--model", str(deep_folder), "--lengths", "32", "--rounds", "1", "--new-tokens", "2",
              "--clock", "wall", "--out", str(out)]  # fmt: skip
    assert bench.main(common) == 0
    layers = json.loads((deep_folder / "config.json").read_text())["num_hidden_layers"]
    from lazyllm import Schedule

    one_stage = Schedule.from_layers(str(deep_folder), layers, {1: 50}).save(tmp_path / "one.json")
    assert (
        bench.main([*common, "--schedule", str(one_stage), "--label", "one stage", "--plot", str(png)]) == 0
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [bench.label_of(r) for r in rows] == ["paper-style", "one stage"]
    assert rows[0]["percentiles"] != rows[1]["percentiles"]
    assert png.stat().st_size > 0
    drawn: list[str] = []
    import matplotlib.axes

    real = matplotlib.axes.Axes.plot

    def spy(self: matplotlib.axes.Axes, *args: object, **kwargs: object) -> object:
        drawn.append(str(kwargs.get("label")))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    bench.plot(rows, tmp_path / "again.png")
    assert "paper-style: TTFT" in drawn and "one stage: TTFT" in drawn
