"""The packaged data (tuner.data.embedded): the quickstart's LongBench records and the fresh-prompt pool
give what the offline copies give (same records, same ids), and no more than they were cut for."""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support import longbench_dir
from tuner.data.embedded import FOLDER, POOL_QUESTIONS, longbench_datasets, longbench_folder, manifest
from tuner.data.longbench import load_prompt_config, longbench_specs
from tuner.data.openqa import (
    FILES,
    FULL_SETS,
    OpenQASource,
    RecordBuilder,
    build_split,
    load_corpus_file,
    resolve_openqa_source,
    split_questions,
)
from tuner.data.sources import DataSource, resolve_source

ROOT = Path(__file__).resolve().parents[3]
SHARED = Path(longbench_dir()).resolve()
OPENQA = SHARED.parent / "open-qa"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from lazyllm.models import prepare_packaged

    return AutoTokenizer.from_pretrained(prepare_packaged("smollm2-135m"))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAZYLLM_CACHE", str(tmp_path / "cache"))  # unpacked afresh by each test


def _shared(path: Path) -> Path:
    if not path.exists():  # a failure, not a skip: CI must compare against the real copies
        pytest.fail(f"offline data not found: {path}")
    return path


def test_manifest_matches_every_packaged_file() -> None:
    files = manifest()
    for name, sha in files["longbench"].items():
        packed = FOLDER / "longbench" / name
        data = (
            packed.read_bytes()
            if packed.is_file()
            else gzip.decompress(packed.with_name(name + ".gz").read_bytes())
        )
        assert hashlib.sha256(data).hexdigest() == sha, name
    for dataset, entry in files["openqa"].items():
        data = gzip.decompress((FOLDER / "openqa" / f"{dataset}.json.gz").read_bytes())
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert (FOLDER / "longbench" / "PROVENANCE.md").is_file() and (
        FOLDER / "openqa" / "PROVENANCE.md"
    ).is_file()
    total = sum(p.stat().st_size for p in FOLDER.rglob("*") if p.is_file())
    assert total < 5_000_000  # a few MB


def test_the_package_ships_the_packaged_files() -> None:
    """Every data file under tuner/data/embedded/ is matched by pyproject.toml's package-data."""
    key = '"tuner.data.embedded" = '  # one line of [tool.setuptools.package-data] (py3.10 has no tomllib)
    line = next(x for x in (ROOT / "pyproject.toml").read_text().splitlines() if x.startswith(key))
    globs = json.loads(line.removeprefix(key))
    data = [p.relative_to(FOLDER).as_posix() for p in FOLDER.rglob("*") if p.is_file() and p.suffix != ".py"]
    data = [p for p in data if "__pycache__" not in p]
    assert data and all(any(fnmatch.fnmatch(p, g) for g in globs) for p in data), data


def test_packaged_longbench_is_the_quickstart_folder_byte_for_byte() -> None:
    folder = longbench_folder()
    assert set(longbench_datasets()) == {s.name for s in longbench_specs("qa", "en")}
    shared = DataSource(_shared(SHARED), "--data-dir")
    packaged = DataSource(folder, "packaged")
    mine, theirs = packaged.load_task("qa", "en"), shared.load_task("qa", "en")
    assert mine == theirs and sum(map(len, mine.values())) == 42  # every record, ids included
    prompts, theirs_prompts = packaged.prompt_config(), load_prompt_config(SHARED)
    assert (prompts.templates, prompts.max_new_tokens) == (
        theirs_prompts.templates,
        theirs_prompts.max_new_tokens,
    )
    assert packaged.fingerprint(list(mine)) == shared.fingerprint(list(mine))  # the same study data


def test_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LONGBENCH_DIR", raising=False)
    assert resolve_source(None, "qa", "en").origin == "packaged"
    assert resolve_source(None, "single-doc-qa", "en").origin == "packaged"
    assert resolve_source(None, "summarization", "en") == DataSource(None, "hub")  # not packaged
    assert resolve_source(None, "qa", "all") == DataSource(None, "hub")  # multifieldqa_zh, dureader
    assert resolve_source(None) == DataSource(None, "hub")  # no task known
    assert resolve_source("hub", "qa", "en") == DataSource(None, "hub")
    assert resolve_source("packaged").origin == "packaged"
    assert "packaged with lazyllm-tuner" in resolve_source("packaged").describe()
    monkeypatch.setenv("LONGBENCH_DIR", str(SHARED))
    assert resolve_source(None, "qa", "en") == DataSource(SHARED, "LONGBENCH_DIR")
    assert resolve_openqa_source("packaged") == OpenQASource(None, "packaged")
    assert resolve_openqa_source("hub") == OpenQASource(None, "hub")


@pytest.mark.parametrize("dataset", list(FILES))
def test_pool_builds_the_folders_records(dataset: str, tokenizer: Any) -> None:
    """The fresh-drift check's prompts at the quickstart's settings (SmolLM2's chat template, 1024
    tokens, split seed 0, --fresh-kl-examples 12), and the whole pool at 1024 and 12 at 2048 tokens."""
    full = load_corpus_file(_shared(OPENQA / FILES[dataset]), dataset)
    packaged = resolve_openqa_source("packaged")
    pool = packaged.load(dataset)
    assert [q.id for q in pool.questions] == [q.id for q in split_questions(full, "validation")][
        :POOL_QUESTIONS
    ]
    assert packaged.fingerprint([dataset]) == OpenQASource(OPENQA, "--openqa-dir").fingerprint([dataset])
    for tokens, limit in ((1024, 12), (1024, POOL_QUESTIONS - 10), (2048, 12)):
        a, b = (
            build_split(
                RecordBuilder(c, tokenizer, chat=True, max_prompt_tokens=tokens), "validation", 0, limit
            )
            for c in (pool, full)
        )
        assert a == b and len(a.records) == limit


def test_pool_refuses_what_it_does_not_hold(tokenizer: Any) -> None:
    pool = resolve_openqa_source("packaged").load("hotpotqa-long")
    builder = RecordBuilder(pool, tokenizer, chat=True, max_prompt_tokens=1024)
    with pytest.raises(ValueError, match=r"validation questions of split seed 0 only, not test") as err:
        build_split(builder, "test", 0, 4)
    assert FULL_SETS in str(err.value)
    with pytest.raises(ValueError, match=r"holds 150 validation questions .* fewer than the 151"):
        build_split(builder, "validation", 0, POOL_QUESTIONS + 1)
    with pytest.raises(ValueError, match=r"fewer than the whole split"):
        build_split(builder, "validation", 0, None)
    long = RecordBuilder(pool, tokenizer, chat=True, max_prompt_tokens=32_000)
    with pytest.raises(
        ValueError, match=r"keeps 48 other passages per question, too few for prompts this long"
    ):
        build_split(long, "validation", 0, 2)
