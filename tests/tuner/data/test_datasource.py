"""LongBench from a local folder or the hub's parquet mirror, exercised offline on files the test writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support import longbench_dir
from tuner.data.longbench import load_records
from tuner.data.sources import DataSource, load_parquet, resolve_source

DATA = Path(longbench_dir()).resolve()
ROOT = Path(__file__).resolve().parents[3]


def write_parquet(path: Path, rows: list[dict[str, object]]) -> Path:
    """A parquet file in LongBench's columns (the hub mirror's layout)."""
    columns = ["input", "context", "answers", "length", "dataset", "language", "all_classes", "_id"]
    table = pa.table({c: [r.get(c) for r in rows] for c in columns})
    pq.write_table(table, path)
    return path


def as_rows(dataset: str) -> list[dict[str, object]]:
    lines = (DATA / f"{dataset}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()][:4]


def test_parquet_rows_become_the_same_records_as_jsonl(tmp_path: Path) -> None:
    for dataset in ("hotpotqa", "trec"):  # trec has all_classes, hotpotqa has null there
        path = write_parquet(tmp_path / f"{dataset}.parquet", as_rows(dataset))
        assert load_parquet(str(path), dataset) == load_records(DATA, dataset)[:4]


def test_bad_parquet_rows_name_the_row(tmp_path: Path) -> None:
    rows = as_rows("hotpotqa")
    rows[2] = {**rows[2], "answers": []}
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(ValueError, match=r"bad\.parquet\[2\]: answers = \[\]"):
        load_parquet(str(path), "hotpotqa")
    twice = write_parquet(tmp_path / "twice.parquet", [rows[0], rows[0]])
    with pytest.raises(ValueError, match="duplicate _id"):
        load_parquet(str(twice), "hotpotqa")
    with pytest.raises(ValueError, match="cannot read LongBench parquet file"):
        load_parquet(str(tmp_path / "missing.parquet"), "hotpotqa")


def test_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGBENCH_DIR", str(DATA))
    assert resolve_source(None) == DataSource(DATA, "LONGBENCH_DIR")
    other = tmp_path / "other"
    other.mkdir()
    (other / "hotpotqa.jsonl").write_text((DATA / "hotpotqa.jsonl").read_text())
    assert resolve_source(str(other)) == DataSource(other, "--data-dir")  # an explicit folder wins
    monkeypatch.delenv("LONGBENCH_DIR")
    assert resolve_source(None).is_hub and resolve_source("").is_hub


def test_hub_path_end_to_end_on_local_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub code path, with the mirror and LongBench's prompt tables pointed at local files."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for dataset in ("hotpotqa", "2wikimqa"):
        write_parquet(mirror / f"{dataset}.parquet", as_rows(dataset))
    monkeypatch.delenv("LONGBENCH_DIR", raising=False)
    monkeypatch.setenv("LONGBENCH_HUB_PARQUET", str(mirror / "{dataset}.parquet"))
    monkeypatch.setenv("LONGBENCH_CONFIG_URL", DATA.as_uri() + "/")
    monkeypatch.setenv("LAZYLLM_CACHE", str(tmp_path / "cache"))
    source = resolve_source(None)
    loaded = source.load_task("hotpotqa,2wikimqa", "en")
    assert {k: v for k, v in loaded.items()} == {
        d: load_records(DATA, d)[:4] for d in ("hotpotqa", "2wikimqa")
    }
    prompts = source.prompt_config()
    assert prompts.source == "longbench"
    assert prompts.templates["hotpotqa"] == json.loads((DATA / "dataset2prompt.json").read_text())["hotpotqa"]
    # fetched once into the cache, then read from there even when the source is gone
    monkeypatch.setenv("LONGBENCH_CONFIG_URL", DATA.as_uri() + "/")
    fingerprint = source.fingerprint(["hotpotqa"])
    assert fingerprint == source.fingerprint(["hotpotqa"]) and fingerprint != source.fingerprint(["2wikimqa"])


def test_unreachable_hub_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LONGBENCH_DIR"}
    env.update(HF_HUB_OFFLINE="1", LAZYLLM_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.evaluate", "--methods", "baseline", "--task", "hotpotqa", "--data-dir", "hub"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "LongBench mirror is unreachable" in lines[0] and "--data-dir" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no outputs/, no cache written
