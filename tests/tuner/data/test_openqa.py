"""Open-QA tasks (hotpotqa-long, squad-long): records built from small files in the official schemas
(and, once, from the real shared files), measured with SmolLM2's tokenizer as the evaluation encodes."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.support import longbench_dir
from tuner.data.longbench import (
    OPENQA_DATASETS,
    TASKS,
    build_prompt,
    encode_prompt,
    resolve_task,
    split_records,
)
from tuner.data.openqa import (
    FILES,
    PROMPTS,
    Corpus,
    RecordBuilder,
    build_split,
    resolve_openqa_source,
    split_questions,
)

SHARED = Path(longbench_dir()).resolve().parent / "open-qa"
WORDS = ("river", "castle", "engine", "garden", "winter", "signal", "harbor", "museum", "violin", "copper")
HUGE = "hp-huge"  # a HotpotQA question whose gold passage alone is ~3000 tokens


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from lazyllm.models import prepare_packaged

    return AutoTokenizer.from_pretrained(prepare_packaged("smollm2-135m"))


def _sentence(draw: random.Random, n: int) -> str:
    return " ".join(draw.choice(WORDS) for _ in range(n)).capitalize() + "."


def _hotpot(n: int = 30) -> list[dict[str, Any]]:
    draw = random.Random(1)
    items = []
    for q in range(n):
        titles = [f"Title {q}-{j}" for j in range(10)]
        if q > 0:
            titles[9] = "Shared title"  # one paragraph in every question: deduplicated, never "other"
        context = [
            [t, [_sentence(draw, draw.randint(8, 25)), " " + _sentence(draw, draw.randint(8, 25))]]
            for t in titles
        ]
        context[-1][1] = ["A paragraph every question has."]
        gold = [titles[3], titles[7]]
        if q == 5:
            context[3][1] = [_sentence(draw, 3000)]
        items.append(
            {
                "_id": HUGE if q == 5 else f"hp{q:03d}",
                "question": f"Which {draw.choice(WORDS)} links {gold[0]} and {gold[1]}?",
                "answer": draw.choice(WORDS),
                "supporting_facts": [[gold[0], 0], [gold[1], 1]],
                "context": context,
                "type": "bridge",
                "level": "easy",
            }
        )
    return items


def _squad(n_articles: int = 4, n_paragraphs: int = 6) -> dict[str, Any]:
    draw = random.Random(2)
    data = []
    for a in range(n_articles):
        paragraphs = []
        for p in range(n_paragraphs):
            text = " ".join(_sentence(draw, draw.randint(10, 30)) for _ in range(3))
            answer = text.split()[2]
            qas = [
                {
                    "id": f"sq{a}-{p}-{k}",
                    "question": f"What is the {k} {draw.choice(WORDS)} of article {a}?",
                    "answers": [
                        {"text": answer, "answer_start": 0},
                        {"text": answer.upper(), "answer_start": 0},
                        {"text": answer, "answer_start": 0},
                    ],
                    "is_impossible": False,
                }
                for k in range(2)
            ]
            qas.append(
                {
                    "id": f"sq{a}-{p}-x",
                    "question": "Unanswerable?",
                    "answers": [],
                    "plausible_answers": [{"text": "x", "answer_start": 0}],
                    "is_impossible": True,
                }
            )
            paragraphs.append({"context": text, "qas": qas})
        data.append({"title": f"Article_{a}", "paragraphs": paragraphs})
    return {"version": "v2.0", "data": data}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("open-qa")
    (root / FILES["hotpotqa-long"]).write_text(json.dumps(_hotpot()))
    (root / FILES["squad-long"]).write_text(json.dumps(_squad()))
    return root


@pytest.fixture(scope="module")
def corpora(folder: Path) -> dict[str, Corpus]:
    source = resolve_openqa_source(folder)
    return {name: source.load(name) for name in OPENQA_DATASETS}


def _prompt(record: Any) -> str:
    return build_prompt(record, PROMPTS)


# --------------------------------------------------------------------------------------------------
# tasks
def test_tasks_are_registered_and_qa_is_unchanged() -> None:
    assert TASKS["openqa"] == ("hotpotqa-long", "squad-long")
    assert [s.name for s in resolve_task("openqa")] == ["hotpotqa-long", "squad-long"]
    assert [s.name for s in resolve_task("hotpotqa,squad-long")] == ["hotpotqa", "squad-long"]
    assert not {"hotpotqa-long", "squad-long"} & set(TASKS["qa"])
    assert all(
        s.source == "openqa" and s.stop_at_newline and s.metric == "qa_f1" for s in OPENQA_DATASETS.values()
    )
    with pytest.raises(
        ValueError, match=r"Unknown task 'hotpot-long'\. Available: .*openqa.*hotpotqa-long, squad-long"
    ):
        resolve_task("hotpot-long")


def test_search_help_lists_the_tasks_and_the_folder_setting() -> None:
    import argparse

    from tuner.study.settings import SearchSettings, add_flags

    parser = argparse.ArgumentParser()
    add_flags(parser, SearchSettings)
    text = " ".join(parser.format_help().split())
    assert "openqa" in text and "hotpotqa-long" in text and "squad-long" in text
    assert "--openqa-dir" in text and "$OPENQA_DIR" in text


def test_templates_are_longbench_own() -> None:
    table = json.loads((Path(longbench_dir()) / "dataset2prompt.json").read_text())
    lengths = json.loads((Path(longbench_dir()) / "dataset2maxlen.json").read_text())
    assert PROMPTS.templates["hotpotqa-long"] == table["hotpotqa"]
    assert PROMPTS.templates["squad-long"] == table["multifieldqa_en"]
    assert PROMPTS.max_new_tokens == {
        "hotpotqa-long": lengths["hotpotqa"],
        "squad-long": lengths["multifieldqa_en"],
    }


# --------------------------------------------------------------------------------------------------
# corpora
def test_corpora_read_the_official_schemas(corpora: dict[str, Corpus]) -> None:
    hotpot, squad = corpora["hotpotqa-long"], corpora["squad-long"]
    assert len(hotpot.questions) == 30 and len(squad.questions) == 4 * 6 * 2  # unanswerable left out
    q = hotpot.questions[1]
    assert [hotpot.passages[i].title for i in q.gold] == ["Title 1-3", "Title 1-7"]
    assert len(q.own) == 8 and q.answers == (q.answers[0],)
    assert sum(p.title == "Shared title" for p in hotpot.passages) == 1  # deduplicated
    s = squad.questions[0]
    assert len(s.answers) == 2  # distinct answer texts, in order
    assert len(s.own) == 5 and all(squad.passages[i].group == "Article_0" for i in s.own)


def test_bad_files_are_one_line_naming_the_place(tmp_path: Path) -> None:
    items = _hotpot(3)
    items[2]["supporting_facts"] = [["No such title", 0]]
    (tmp_path / FILES["hotpotqa-long"]).write_text(json.dumps(items))
    (tmp_path / FILES["squad-long"]).write_text("{not json")
    source = resolve_openqa_source(tmp_path)
    with pytest.raises(
        ValueError, match=r"hotpot_dev_distractor_v1\.json\[2\]: supporting fact title 'No such title'"
    ):
        source.load("hotpotqa-long")
    with pytest.raises(ValueError, match=r"squad_dev_v2\.0\.json: invalid JSON"):
        source.load("squad-long")
    (tmp_path / FILES["squad-long"]).unlink()
    with pytest.raises(ValueError, match=r"no such file \(open-QA dataset 'squad-long', from --openqa-dir\)"):
        source.load("squad-long")


def test_resolution_order(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENQA_DIR", raising=False)
    assert resolve_openqa_source(None).folder is None
    monkeypatch.setenv("OPENQA_DIR", str(folder))
    assert resolve_openqa_source(None) == resolve_openqa_source(None).__class__(folder, "OPENQA_DIR")
    assert resolve_openqa_source(tmp_path).origin == "--openqa-dir"
    with pytest.raises(ValueError, match=r"from --openqa-dir\) does not exist"):
        resolve_openqa_source(tmp_path / "absent")


# --------------------------------------------------------------------------------------------------
# records
@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("budget", [300, 700])
def test_every_prompt_fits_uncut_with_its_gold_passages_whole(
    corpora: dict[str, Corpus], tokenizer: Any, chat: bool, budget: int
) -> None:
    for name, corpus in corpora.items():
        built = build_split(
            RecordBuilder(corpus, tokenizer, chat=chat, max_prompt_tokens=budget), "validation"
        )
        test = build_split(RecordBuilder(corpus, tokenizer, chat=chat, max_prompt_tokens=budget), "test")
        questions = {q.id: q for q in corpus.questions}
        for record in built.records + test.records:
            text = _prompt(record)
            whole = encode_prompt(tokenizer, text, chat, 10**9)
            assert len(whole) <= budget
            assert encode_prompt(tokenizer, text, chat, budget) == whole  # nothing is cut
            assert len(whole) >= budget - 140  # filled (within a passage or two of the budget)
            q = questions[record.id]
            for i in q.gold:
                assert corpus.passages[i].text in record.context
            assert record.answers == list(q.answers) and record.input == q.question
        if name == "hotpotqa-long":
            assert HUGE in built.skipped + test.skipped  # counted, never cut
            assert HUGE not in {r.id for r in built.records + test.records}


def test_hotpot_draws_its_own_distractors_first_then_other_questions(
    corpora: dict[str, Corpus], tokenizer: Any
) -> None:
    corpus = corpora["hotpotqa-long"]
    titles_of = {q.id: {corpus.passages[i].title for i in q.gold + q.own} for q in corpus.questions}
    for budget, expect_others in ((300, False), (1500, True)):
        builder = RecordBuilder(corpus, tokenizer, chat=True, max_prompt_tokens=budget)
        for q in corpus.questions[:8]:
            record = builder.build(q)
            if record is None:
                continue
            shown = [
                line for line in record.context.split("\n") if line.startswith(("Title ", "Shared title"))
            ]
            others = [t for t in shown if t not in titles_of[q.id]]
            assert bool(others) == expect_others  # 8 own distractors (~300 tokens) fill 300, not 1500
            assert record.context.startswith("Passage 1:\n")
            if expect_others:
                assert titles_of[q.id] <= set(shown)  # every own paragraph in before any other
                assert "Shared title" not in others  # a passage of its own is never an "other"


def test_records_are_deterministic_and_independent_of_build_order(
    corpora: dict[str, Corpus], tokenizer: Any
) -> None:
    for corpus in corpora.values():
        questions = list(corpus.questions)

        def build(order: list[Any], seed: int, corpus: Corpus = corpus) -> dict[str, str]:
            builder = RecordBuilder(corpus, tokenizer, chat=True, max_prompt_tokens=600, seed=seed)
            return {q.id: _prompt(r) for q in order if (r := builder.build(q)) is not None}

        forward = build(questions, 0)
        assert build(questions[::-1], 0) == forward  # a fresh builder, the other order: same bytes
        other_seed = build(questions, 1)
        assert other_seed.keys() == forward.keys()
        assert sum(other_seed[k] != forward[k] for k in forward) > len(forward) // 2


def test_splits_never_overlap_at_any_prompt_length(corpora: dict[str, Corpus], tokenizer: Any) -> None:
    for corpus in corpora.values():
        ids = {q.id for q in corpus.questions}
        for budget in (300, 1500):
            val, test = (
                build_split(RecordBuilder(corpus, tokenizer, chat=True, max_prompt_tokens=budget), split)
                for split in ("validation", "test")
            )
            val_ids = {r.id for r in val.records} | set(val.skipped)
            test_ids = {r.id for r in test.records} | set(test.skipped)
            assert not val_ids & test_ids and val_ids | test_ids == ids
            assert val_ids == {
                q.id for q in split_records(corpus.questions, "validation")
            }  # the hashed split


def test_a_split_is_taken_in_a_hashed_order_so_any_prefix_samples_every_article(
    corpora: dict[str, Corpus],
) -> None:
    corpus = corpora["squad-long"]
    for split in ("validation", "test"):
        ordered = split_questions(corpus, split)
        assert {q.id for q in ordered} == {q.id for q in split_records(corpus.questions, split)}
        assert ordered != split_records(corpus.questions, split)  # not the file's order
        reversed_file = Corpus(corpus.dataset, corpus.passages, corpus.questions[::-1])
        assert split_questions(reversed_file, split) == ordered  # whatever the file's order
    in_file_order = split_records(corpus.questions, "test")[:8]  # 4 articles, grouped in the file
    assert len({g for q in in_file_order for g in q.groups}) == 1
    assert len({g for q in split_questions(corpus, "test")[:8] for g in q.groups}) >= 2


def test_limit_counts_built_records(corpora: dict[str, Corpus], tokenizer: Any) -> None:
    corpus = corpora["hotpotqa-long"]
    split = [q.id for q in split_questions(corpus, "test")]
    assert HUGE in split[:6]  # the test split holds the question that cannot fit
    built = build_split(RecordBuilder(corpus, tokenizer, chat=True, max_prompt_tokens=300), "test", limit=5)
    assert len(built.records) == 5 and built.skipped == (HUGE,)
    assert [r.id for r in built.records] == [i for i in split if i != HUGE][:5]


def test_building_shows_progress_only_when_asked(
    corpora: dict[str, Corpus], tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    builder = RecordBuilder(corpora["hotpotqa-long"], tokenizer, chat=True, max_prompt_tokens=300)
    quiet = build_split(builder, "test", limit=3)
    assert "build hotpotqa-long test records" not in capsys.readouterr().err
    shown = build_split(builder, "test", limit=3, progress=True)
    assert "build hotpotqa-long test records" in capsys.readouterr().err
    assert shown == quiet  # the same records either way


# --------------------------------------------------------------------------------------------------
# the hub path, on local parquet files in the hub's columns
def _hub_rows(folder: Path) -> dict[str, list[dict[str, Any]]]:
    hotpot = json.loads((folder / FILES["hotpotqa-long"]).read_text())
    squad = json.loads((folder / FILES["squad-long"]).read_text())
    return {
        "hotpotqa-long": [
            {
                "id": q["_id"],
                "question": q["question"],
                "answer": q["answer"],
                "type": q["type"],
                "level": q["level"],
                "supporting_facts": {
                    "title": [t for t, _ in q["supporting_facts"]],
                    "sent_id": [s for _, s in q["supporting_facts"]],
                },
                "context": {"title": [t for t, _ in q["context"]], "sentences": [s for _, s in q["context"]]},
            }
            for q in hotpot
        ],
        "squad-long": [
            {
                "id": qa["id"],
                "title": article["title"],
                "context": p["context"],
                "question": qa["question"],
                "answers": {
                    "text": [a["text"] for a in qa["answers"]],
                    "answer_start": [a["answer_start"] for a in qa["answers"]],
                },
            }
            for article in squad["data"]
            for p in article["paragraphs"]
            for qa in p["qas"]
        ],
    }


def test_hub_path_builds_the_same_records_from_local_parquet(
    folder: Path, corpora: dict[str, Corpus], tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datasets import Dataset

    for name, rows in _hub_rows(folder).items():
        Dataset.from_list(rows).to_parquet(str(tmp_path / f"{name}.parquet"))
    monkeypatch.delenv("OPENQA_DIR", raising=False)
    monkeypatch.setenv("OPENQA_HUB_PARQUET", str(tmp_path / "{dataset}.parquet"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    source = resolve_openqa_source(None)
    assert source.folder is None and source.location("squad-long").endswith("squad-long.parquet")
    for name, local in corpora.items():
        hub = source.load(name)
        assert hub == local
        a, b = (
            build_split(RecordBuilder(c, tokenizer, chat=True, max_prompt_tokens=500), "validation", limit=4)
            for c in (hub, local)
        )
        assert [_prompt(r) for r in a.records] == [_prompt(r) for r in b.records]


def test_unreachable_hub_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OPENQA_DIR", raising=False)
    monkeypatch.setenv("OPENQA_HUB_PARQUET", "https://127.0.0.1:9/{dataset}.parquet")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    with pytest.raises(
        ValueError, match=r"hub's copy of hotpotqa-long's source is unreachable .*--openqa-dir DIR"
    ) as err:
        resolve_openqa_source(None).load("hotpotqa-long")
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------------
# through the evaluation
def test_build_examples_for_the_openqa_task(folder: Path, tokenizer: Any, tmp_path: Path) -> None:
    from tuner.evaluation.runner import build_examples, data_fingerprint
    from tuner.study.settings import EvalSettings

    config = EvalSettings(
        task="openqa", openqa_dir=str(folder), max_prompt_tokens=400, n_examples=3, split="test"
    )
    with pytest.warns(
        UserWarning, match=r"hotpotqa-long: 1 test question\(s\) skipped, .* 400 tokens \(first: hp-huge\)"
    ):
        examples = build_examples(config, tokenizer)
    assert [ex.dataset for ex in examples] == ["hotpotqa-long"] * 3 + ["squad-long"] * 3
    assert all(len(ex.input_ids) <= 400 and ex.stop_strings == ("\n",) for ex in examples)
    assert [ex.max_new_tokens for ex in examples] == [32] * 6  # the settings' cap (LongBench: 32 and 64)
    assert len(examples[-1].answers) == 2
    before = data_fingerprint(config)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in FILES.values():
        (copy / name).write_text((folder / name).read_text())
    assert data_fingerprint(dataclasses.replace(config, openqa_dir=str(copy))) == before
    (copy / FILES["squad-long"]).write_text(
        (folder / FILES["squad-long"]).read_text().replace("Article_3", "Article_9")
    )
    assert data_fingerprint(dataclasses.replace(config, openqa_dir=str(copy))) != before


def test_real_shared_files(tokenizer: Any) -> None:
    if not (SHARED / FILES["hotpotqa-long"]).is_file():  # a failure, not a skip: CI must read real data
        pytest.fail(f"open-QA data not found in {SHARED}")
    source = resolve_openqa_source(SHARED)
    for name in OPENQA_DATASETS:
        corpus = source.load(name)
        built = build_split(
            RecordBuilder(corpus, tokenizer, chat=True, max_prompt_tokens=1024), "validation", limit=4
        )
        assert len(built.records) == 4 and not built.skipped
        questions = {q.id: q for q in corpus.questions}
        for record in built.records:
            ids = encode_prompt(tokenizer, _prompt(record), True, 10**9)
            assert 1024 - 200 <= len(ids) <= 1024
            assert all(corpus.passages[i].text in record.context for i in questions[record.id].gold)
    # squad-long: every answerable question of the file (the shared subset holds 4,299 of 24 articles)
    squad = json.loads((SHARED / FILES["squad-long"]).read_text(encoding="utf-8"))
    qas = [qa for article in squad["data"] for p in article["paragraphs"] for qa in p["qas"]]
    assert len(corpus.questions) == sum(not qa.get("is_impossible", False) for qa in qas) > 0
    # the shared subset has 24 articles (its README); in file order 100 questions cover 1-2 of them
    for split in ("validation", "test"):
        assert len({g for q in split_questions(corpus, split)[:100] for g in q.groups}) >= 20


def test_openqa_preset_is_valid_settings() -> None:
    from tuner.study.settings import EvaluateSettings, SearchSettings, resolve_settings

    search = resolve_settings("openqa", {}, SearchSettings)
    assert (search.task, search.n_examples, search.max_prompt_tokens, search.dtype, search.heldout) == (
        "openqa",
        12,
        2048,
        "bfloat16",
        True,
    )
    # the calibration has the power the power curve asks for (>= 200 task-scored examples)
    assert search.confirm_n_examples is not None and 2 * search.confirm_n_examples >= 200
    evaluate = resolve_settings("openqa", {"methods": "baseline"}, EvaluateSettings)
    # the same examples, at the same length and in the same dtype, to both
    assert (evaluate.task, evaluate.max_prompt_tokens, evaluate.dtype) == ("openqa", 2048, "bfloat16")
