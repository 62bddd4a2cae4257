"""LongBench tasks, records, splits and prompts, on the local LongBench data (LONGBENCH_DIR)."""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path

import pytest

from tests.support import longbench_dir
from tuner.data.longbench import (
    DATASETS,
    GENERIC_TEMPLATE,
    TASKS,
    DatasetSpec,
    MissingDataset,
    PromptConfig,
    Record,
    build_prompt,
    data_dir,
    load_prompt_config,
    load_records,
    load_task,
    max_new_tokens,
    resolve_task,
    split_records,
    truncate_middle,
)
from tuner.data.metrics import METRICS

DATA = Path(longbench_dir()).resolve()


@pytest.fixture
def data() -> Path:
    if not (DATA / "hotpotqa.jsonl").is_file():  # a failure, not a skip: CI must always read real data
        pytest.fail(f"LongBench data not found in {DATA}; set LONGBENCH_DIR")
    return DATA


def _in_file(data: Path, dataset: str) -> list[dict[str, object]]:
    """The records of the shared ``<dataset>.jsonl``, read plainly: what the loader must give back,
    whichever release of the file the folder holds."""
    lines = (data / f"{dataset}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _line(record_id: str, **fields: object) -> str:
    obj = {"_id": record_id, "context": "ctx", "input": "q?", "answers": ["a"], **fields}
    return json.dumps(obj) + "\n"


def _names(specs: list[DatasetSpec]) -> list[str]:
    return [spec.name for spec in specs]


# --------------------------------------------------------------------------------------------------
# datasets and tasks
def test_datasets_table() -> None:
    assert len(DATASETS) == 21
    metric = {name: spec.metric for name, spec in DATASETS.items()}
    assert metric == {
        "narrativeqa": "qa_f1",
        "qasper": "qa_f1",
        "multifieldqa_en": "qa_f1",
        "multifieldqa_zh": "qa_f1_zh",
        "hotpotqa": "qa_f1",
        "2wikimqa": "qa_f1",
        "musique": "qa_f1",
        "dureader": "rouge_zh",
        "gov_report": "rouge",
        "qmsum": "rouge",
        "multi_news": "rouge",
        "vcsum": "rouge_zh",
        "trec": "classification",
        "triviaqa": "qa_f1",
        "samsum": "rouge",
        "lsht": "classification",
        "passage_count": "count",
        "passage_retrieval_en": "retrieval",
        "passage_retrieval_zh": "retrieval_zh",
        "lcc": "code_sim",
        "repobench-p": "code_sim",
    }
    assert all(spec.metric in METRICS for spec in DATASETS.values())
    no_chat = {"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"}
    assert {n for n, s in DATASETS.items() if not s.chat_template} == no_chat
    assert {n for n, s in DATASETS.items() if s.stop_at_newline} == {"samsum"}
    assert {n for n, s in DATASETS.items() if s.first_line} == {"trec", "triviaqa", "samsum", "lsht"}
    zh = {"multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh"}
    assert {n for n, s in DATASETS.items() if s.language == "zh"} == zh


def test_tasks_table() -> None:
    assert TASKS["single-doc-qa"] == ("narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh")
    assert TASKS["multi-doc-qa"] == ("hotpotqa", "2wikimqa", "musique", "dureader")
    assert TASKS["summarization"] == ("gov_report", "qmsum", "multi_news", "vcsum")
    assert TASKS["few-shot"] == ("trec", "triviaqa", "samsum", "lsht")
    assert TASKS["synthetic"] == ("passage_count", "passage_retrieval_en", "passage_retrieval_zh")
    assert TASKS["code"] == ("lcc", "repobench-p")
    assert TASKS["qa"] == TASKS["single-doc-qa"] + TASKS["multi-doc-qa"]


def test_dataset_spec_validates() -> None:
    with pytest.raises(ValueError, match="category = 'qa'"):
        DatasetSpec("x", "qa", "en", "qa_f1")
    with pytest.raises(ValueError, match="metric = 'bleu'"):
        DatasetSpec("x", "code", "en", "bleu")
    with pytest.raises(ValueError, match="language = 'fr'"):
        DatasetSpec("x", "code", "fr", "code_sim")
    with pytest.raises(ValueError, match="first_line = 1"):
        DatasetSpec("x", "code", "en", "code_sim", first_line=1)  # type: ignore[arg-type]


def test_resolve_task_categories_and_language() -> None:
    qa_en = ["narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique"]
    assert _names(resolve_task("qa")) == qa_en
    assert _names(resolve_task("qa", "en")) == qa_en
    assert _names(resolve_task("qa", "zh")) == ["multifieldqa_zh", "dureader"]
    assert len(resolve_task("qa", "all")) == 8
    assert _names(resolve_task("summarization")) == ["gov_report", "qmsum", "multi_news"]
    assert _names(resolve_task("synthetic", "zh")) == ["passage_retrieval_zh"]
    assert _names(resolve_task("code")) == ["lcc", "repobench-p"]


def test_resolve_task_lists_and_explicit_names() -> None:
    # deduplicated in the order named; lsht is filtered out by language, trec is not repeated
    assert _names(resolve_task("trec, hotpotqa,few-shot")) == ["trec", "hotpotqa", "triviaqa", "samsum"]
    # a dataset named explicitly is kept whatever its language
    assert _names(resolve_task("multifieldqa_zh", "en")) == ["multifieldqa_zh"]
    assert _names(resolve_task("code,lsht", "en")) == ["lcc", "repobench-p", "lsht"]


def test_resolve_task_errors() -> None:
    with pytest.raises(ValueError, match=r"^Unknown task 'foo'\. Available: single-doc-qa, multi-doc-qa"):
        resolve_task("qa,foo")
    with pytest.raises(ValueError, match="language = 'fr'"):
        resolve_task("qa", "fr")
    with pytest.raises(ValueError, match="no datasets in language 'zh'"):
        resolve_task("code", "zh")
    with pytest.raises(ValueError, match="task"):
        resolve_task(" ")


# --------------------------------------------------------------------------------------------------
# records
def test_load_hotpotqa(data: Path) -> None:
    records = load_records(data, "hotpotqa")
    in_file = _in_file(data, "hotpotqa")
    assert len(records) == len(in_file) > 0  # every record, none dropped
    assert len({r.id for r in records}) == len(records)
    for r in records:
        assert r.dataset == "hotpotqa" and r.language == "en"
        assert r.id and r.context and r.input and r.answers and all(r.answers)
        assert r.all_classes is None
        assert isinstance(r.length, int) and r.length > 0
    assert [r.answers for r in records] == [d["answers"] for d in in_file]  # in file order


def test_load_trec_classes(data: Path) -> None:
    records = load_records(data, "trec")
    assert len(records) == len(_in_file(data, "trec")) > 0
    assert all(r.all_classes is not None and len(r.all_classes) == 50 for r in records)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MissingDataset, match=r"hotpotqa\.jsonl"):
        load_records(tmp_path, "hotpotqa")
    assert issubclass(MissingDataset, FileNotFoundError)
    with pytest.raises(ValueError, match="Unknown dataset 'nope'"):
        load_records(tmp_path, "nope")


def test_corrupt_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "hotpotqa.jsonl"
    path.write_text(_line("r1") + "\n" + '{"_id": "r2", "context": \n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: invalid JSON: "):
        load_records(tmp_path, "hotpotqa")


@pytest.mark.parametrize(
    ("second_line", "message"),
    [
        ('{"_id": "r2", "context": "c", "input": "q"}\n', r":2: missing field 'answers'"),
        (_line("r2", answers="Bob"), r":2: answers = 'Bob': must be a non-empty list"),
        (_line("r2", answers=[]), r":2: answers = \[\]"),
        (_line("r2", length="long"), r":2: length = 'long'"),
        (_line("r1"), r":2: duplicate _id 'r1' \(first at line 1\)"),
        ("[1, 2]\n", r":2: expected a JSON object, got list"),
    ],
)
def test_bad_record_names_file_line_field(tmp_path: Path, second_line: str, message: str) -> None:
    (tmp_path / "musique.jsonl").write_text(_line("r1") + second_line)
    with pytest.raises(ValueError, match=rf"musique\.jsonl{message}"):
        load_records(tmp_path, "musique")


def test_record_defaults_and_braces(tmp_path: Path) -> None:
    (tmp_path / "dureader.jsonl").write_text(_line("z1", context="{x} {context}"))
    [record] = load_records(tmp_path, "dureader")
    assert record.language == "zh"  # from the spec when the file has no language field
    assert record.length is None and record.all_classes is None
    assert record.context == "{x} {context}"


# --------------------------------------------------------------------------------------------------
# data folder and task loading
def test_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: Path) -> None:
    monkeypatch.delenv("LONGBENCH_DIR", raising=False)
    with pytest.raises(ValueError, match="pass --data-dir or set LONGBENCH_DIR"):
        data_dir(None)
    with pytest.raises(ValueError, match=rf"{re.escape(str(tmp_path))} .*has no \*\.jsonl files"):
        data_dir(tmp_path)
    missing = tmp_path / "absent"
    with pytest.raises(ValueError, match=rf"{re.escape(str(missing))} .*does not exist"):
        data_dir(missing)
    assert data_dir(str(data)) == data
    monkeypatch.setenv("LONGBENCH_DIR", str(data))
    assert data_dir(None) == data
    monkeypatch.setenv("LONGBENCH_DIR", str(tmp_path))
    assert data_dir(data) == data  # an explicit folder wins over the environment


def test_empty_folder_error_via_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LONGBENCH_DIR", str(tmp_path))
    with pytest.raises(
        ValueError, match=rf"{re.escape(str(tmp_path))} \(from LONGBENCH_DIR\) has no \*\.jsonl"
    ):
        data_dir(None)


def test_load_task_warns_for_missing(tmp_path: Path) -> None:
    (tmp_path / "hotpotqa.jsonl").write_text(_line("h1") + _line("h2"))
    with pytest.warns(UserWarning) as caught:
        loaded = load_task("multi-doc-qa", "en", tmp_path)
    assert list(loaded) == ["hotpotqa"]
    assert [r.id for r in loaded["hotpotqa"]] == ["h1", "h2"]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert "'2wikimqa' not found" in messages[0] and "'musique' not found" in messages[1]


def test_load_task_none_present(tmp_path: Path) -> None:
    (tmp_path / "hotpotqa.jsonl").write_text(_line("h1"))
    with pytest.warns(UserWarning), pytest.raises(ValueError) as info:
        load_task("code", "en", tmp_path)
    assert (
        str(info.value) == f"no data for task 'code' in {tmp_path}: looked for lcc.jsonl, repobench-p.jsonl"
    )


def test_load_task_real_qa(data: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_task("qa", "en", data)
    # every record of each of the task's six files (the shared folder's release holds 5-10 of each:
    # its README, section 2)
    names = ["narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique"]
    assert {name: len(records) for name, records in loaded.items()} == {
        name: len(_in_file(data, name)) for name in names
    }


# --------------------------------------------------------------------------------------------------
# splits
def _records(dataset: str, n: int) -> list[Record]:
    return [Record(f"{dataset}-{i}", dataset, "c", "q", ["a"]) for i in range(n)]


def test_split_four_records(data: Path) -> None:
    # pins the shared folder's reconstructed passage_count.jsonl (README section 2: 4 records, ids
    # minilongbench:passage_count:<key>); the hashes below are those of its ids
    records = load_records(data, "passage_count")
    assert len(records) == 4
    for seed in range(20):
        val = split_records(records, "validation", seed=seed)
        test = split_records(records, "test", seed=seed)
        assert val and test
        assert not {r.id for r in val} & {r.id for r in test}
        assert sorted(r.id for r in val + test) == sorted(r.id for r in records)
        # order follows the file
        assert val == [r for r in records if r in val] and test == [r for r in records if r in test]
    assert split_records(records, "validation") == split_records(records, "validation", seed=0)
    # seed 0 hashes: .183, .422, .291, .342 -> records 0 and 2 are below 0.3
    assert [r.id[-1] for r in split_records(records, "validation")] == ["0", "2"]
    assert [r.id[-1] for r in split_records(records, "validation", seed=1)] == ["0"]


def test_split_follows_documented_hash(data: Path) -> None:
    records = load_records(data, "multi_news")
    val = split_records(records, "validation", seed=0)
    expected = [
        r
        for r in records
        if int.from_bytes(hashlib.sha256(f"0:{r.id}".encode()).digest()[:8], "big") / 2**64 < 0.3
    ]
    assert val == expected
    # a known answer on the official multi_news.jsonl (byte-identical in the shared folder: 200 records,
    # sha256 in its official_checksums.json): seed 0 puts 59 in validation, 141 in test
    assert len(records) == 200 and len(val) == 59
    assert len(split_records(records, "test", seed=0)) == 141
    assert split_records(records, "validation", seed=1) != val  # the seed changes the split
    assert len(split_records(records, "validation", seed=0, validation_fraction=0.5)) > len(val)


def test_split_forces_both_sides() -> None:
    records = _records("hotpotqa", 5)

    def unit(r: Record) -> float:
        return int.from_bytes(hashlib.sha256(f"0:{r.id}".encode()).digest()[:8], "big") / 2**64

    # all hash into test: the lowest-hash record moves to validation
    val = split_records(records, "validation", validation_fraction=1e-12)
    assert val == [min(records, key=unit)]
    assert len(split_records(records, "test", validation_fraction=1e-12)) == 4
    # all hash into validation: the highest-hash record moves to test
    assert split_records(records, "test", validation_fraction=1 - 1e-12) == [max(records, key=unit)]
    # a single record stays where its hash puts it
    [single] = _records("musique", 1)
    assert split_records([single], "validation", validation_fraction=1e-12) == []
    # the guarantee holds per dataset in a mixed list
    mixed = _records("a", 3) + _records("b", 3)
    val = split_records(mixed, "validation", validation_fraction=1e-12)
    assert sorted(r.dataset for r in val) == ["a", "b"]


def test_split_errors() -> None:
    records = _records("x", 3)
    with pytest.raises(ValueError, match="split = 'train'"):
        split_records(records, "train")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="validation_fraction = 0"):
        split_records(records, "test", validation_fraction=0)
    with pytest.raises(ValueError, match="validation_fraction = 1"):
        split_records(records, "test", validation_fraction=1)


# --------------------------------------------------------------------------------------------------
# prompts
def test_longbench_prompts(data: Path) -> None:
    config = load_prompt_config(data)
    assert config.source == "longbench"
    templates = json.loads((data / "dataset2prompt.json").read_text(encoding="utf-8"))
    record = load_records(data, "hotpotqa")[0]
    prompt = build_prompt(record, config)
    assert prompt == templates["hotpotqa"].format(context=record.context, input=record.input)
    assert prompt.startswith("Answer the question based on the given passages.")
    assert prompt.endswith(f"Question: {record.input}\nAnswer:")
    assert max_new_tokens(config, "hotpotqa") == 32
    assert max_new_tokens(config, "gov_report") == 512
    assert max_new_tokens(config, "lcc") == 64
    # repobench-p puts nothing between context and input; passage_count has no {input} at all
    code = load_records(data, "repobench-p")[0]
    assert (
        build_prompt(code, config)
        == f"Please complete the code given below. \n{code.context}Next line of code:\n"
    )


def test_prompt_keeps_braces_in_values(data: Path) -> None:
    config = load_prompt_config(data)
    record = Record("b1", "lcc", "def f():\n    return {'a': 1}  # {input} {0}\n", "", ["x"])
    assert build_prompt(record, config) == (
        "Please complete the code given below. \n"
        "def f():\n    return {'a': 1}  # {input} {0}\nNext line of code:\n"
    )


def test_generic_prompt_fallback(tmp_path: Path) -> None:
    with pytest.warns(UserWarning) as caught:
        config = load_prompt_config(tmp_path)
    assert len(caught) == 1
    assert "dataset2prompt.json and dataset2maxlen.json not found" in str(caught[0].message)
    assert config.source == "generic"
    record = Record("g1", "hotpotqa", "CTX {x}", "Q?", ["a"])
    assert build_prompt(record, config) == "Read the text and answer.\n\nCTX {x}\n\nQuestion: Q?\nAnswer:"
    assert build_prompt(record, config) == GENERIC_TEMPLATE.format(context="CTX {x}", input="Q?")
    assert max_new_tokens(config, "gov_report") == 64
    assert config == PromptConfig.generic()


def test_prompt_config_validates(tmp_path: Path) -> None:
    (tmp_path / "dataset2prompt.json").write_text(json.dumps({"hotpotqa": "{context} {question}"}))
    (tmp_path / "dataset2maxlen.json").write_text(json.dumps({"hotpotqa": 32}))
    with pytest.raises(ValueError, match=r"template for 'hotpotqa' uses \['question'\]"):
        load_prompt_config(tmp_path)
    (tmp_path / "dataset2prompt.json").write_text(json.dumps({"hotpotqa": "{context}"}))
    (tmp_path / "dataset2maxlen.json").write_text(json.dumps({"hotpotqa": 0}))
    with pytest.raises(ValueError, match="max_new_tokens for 'hotpotqa' = 0"):
        load_prompt_config(tmp_path)
    (tmp_path / "dataset2maxlen.json").write_text("{")
    with pytest.raises(ValueError, match=r"dataset2maxlen\.json: invalid JSON"):
        load_prompt_config(tmp_path)
    config = PromptConfig("longbench", {"hotpotqa": "{context}"}, {"hotpotqa": 8}, origin="here")
    with pytest.raises(ValueError, match="no prompt template for 'musique' in here"):
        build_prompt(_records("musique", 1)[0], config)
    with pytest.raises(ValueError, match="no max_new_tokens for 'musique' in here"):
        max_new_tokens(config, "musique")


def test_truncate_middle() -> None:
    ids = list(range(1, 11))
    assert truncate_middle(ids, 4) == [1, 2, 9, 10]
    assert truncate_middle(ids, 5) == [1, 2, 8, 9, 10]  # odd: the extra token comes from the end
    assert truncate_middle(ids, 1) == [10]
    assert truncate_middle(ids, 10) == ids
    assert truncate_middle(ids, 50) == ids
    assert truncate_middle([], 3) == []
    out = truncate_middle(ids, 10)
    out.append(0)
    assert ids == list(range(1, 11))  # a new list, never the input
    with pytest.raises(ValueError, match="max_tokens = 0"):
        truncate_middle(ids, 0)
