"""benchmarks/heldout_kl.py on a real tiny study: a row per held-out row with its test KL and the paired
difference to the recommendation; it writes nothing into the study but the test reference cache, and a
folder without a finished study is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import load_benchmark, longbench_dir
from tuner.search import main as search

pytestmark = pytest.mark.usefixtures("one_thread")


def _files(folder: Path) -> set[Path]:
    return {p.relative_to(folder) for p in folder.rglob("*") if p.is_file()}


def test_every_heldout_row_gets_its_test_kl(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(tiny_folder), "--task", "hotpotqa,trec", "--n-examples", "1",
            "--max-prompt-tokens", "64", "--max-new-tokens", "2", "--data-dir", longbench_dir(),
            "--output", str(tmp_path), "--study-name", "s", "--sampler", "random", "--tracking-uri", "none",
            "--n-trials", "2", "--speedup", "flops", "--timing-rounds", "1"]  # fmt: skip
    assert search(argv) == 0
    study = tmp_path / "s"
    before = _files(study)
    heldout = json.loads((study / "heldout.json").read_text())
    bench = load_benchmark("heldout_kl")
    out = tmp_path / "kl.json"
    assert bench.main([str(study), "--data-dir", longbench_dir(), "--threads", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["study"] == "s" and data["n_test"] == 2  # one test example per dataset
    assert [r["schedule"] for r in data["rows"]] == [r["schedule"] for r in heldout["rows"]]
    assert data["rows"][0]["schedule"] == "recommended" and data["rows"][0]["kl_recommended_minus_it"] is None
    for row, held in zip(data["rows"], heldout["rows"]):
        kl = row["test_kl"]
        assert kl["n"] == 2 and kl["level"] == 0.9 and 0 <= kl["low"] <= kl["value"] <= kl["high"]
        assert 0 <= row["test_top1"] <= 1
        assert (row["test_speedup"], row["test_loss"]) == (held["test_speedup"], held["test_loss"])
    for row in data["rows"][1:]:
        diff = row["kl_recommended_minus_it"]
        assert diff["low"] <= diff["value"] <= diff["high"]
    added = _files(study) - before
    assert added and all(p.parts[0] == "cache" for p in added)  # the test split's fidelity reference only

    capsys.readouterr()
    (study / "heldout.json").unlink()
    assert bench.main([str(study)]) == 2
    assert "has no heldout.json" in capsys.readouterr().err
