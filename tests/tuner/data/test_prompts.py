"""Issue 50: the user's own prompts file as a task. Bad files are refused before any state (one line
naming the file, the row and the fix; exit 2; nothing written), good ones load the same through every
format, split by id as every task does, and a changed file is another study."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tuner.data.longbench import FILE_DATASET, is_prompts_path, resolve_task, split_records
from tuner.data.metrics import METRICS, agreement_score
from tuner.data.prompts import MIN_SPLIT, check_splits, heldout_note, load_prompts_file
from tuner.report.decision import power_line as format_power_line
from tuner.search import main as search
from tuner.search import parse_settings
from tuner.stages.decision import TrialTiming, decide, recommendation_certainty
from tuner.stages.outcome import StudyOutcome


def _jsonl(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _rows(n: int, **extra: object) -> list[dict[str, object]]:
    return [{"id": f"q{i}", "prompt": f"Question {i}: what is {i} + 1?", **extra} for i in range(n)]


def _refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> str:
    """Run the search CLI on ``name`` in an empty folder: exit 2, one line, and nothing written."""
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert search(["--task", name, "--n-trials", "1"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no runs/ folder, no file
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


BAD: dict[str, tuple[Callable[[Path], None], str]] = {
    "missing file": (lambda p: None, "no such file"),
    "empty file": (lambda p: p.write_text(""), "empty file"),
    "malformed JSON on row 3": (
        lambda p: p.write_text(_jsonl(_rows(2)) + '{"prompt": "x",\n'),
        "row on line 3: malformed JSON",
    ),
    "a row without prompt": (lambda p: p.write_text(_jsonl([*_rows(3), {"id": "z", "answers": ["a"]}])), "row 4: no 'prompt'"),
    "an empty prompt": (lambda p: p.write_text(_jsonl([*_rows(1), {"id": "z", "prompt": "  "}])), "row 2: empty prompt"),
    "answers not a list of strings": (
        lambda p: p.write_text(_jsonl([{"prompt": "a", "answers": ["x"]}, {"prompt": "b", "answers": "y"}])),
        "row 2: answers = 'y' is not a non-empty list of strings",
    ),
    "an unknown metric": (
        lambda p: p.write_text(_jsonl([*_rows(2), {"prompt": "c", "metric": "bleu"}])),
        f"row 3: unknown metric 'bleu'; valid: {', '.join(METRICS)}",
    ),
    "duplicate ids": (lambda p: p.write_text(_jsonl([*_rows(3), {"id": "q1", "prompt": "again"}])), "row 4: id 'q1' repeats row 2"),
    "non-UTF-8 bytes": (
        lambda p: p.write_bytes(_jsonl(_rows(2)).encode() + b'{"prompt": "caf\xe9"}\n'),
        "line 3 is not UTF-8 (byte 0xe9",
    ),
    "a 50 MB single line": (
        lambda p: p.write_text('{"prompt": "' + "a" * (50 * 2**20) + '"}\n'),
        "line 1 is longer than 8 MiB",
    ),
    "a binary file": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 10), "binary content (a NUL byte on line"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_prompts_file_is_one_line_naming_file_and_row_and_nothing_is_written(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write, expected = BAD[case]
    write(tmp_path / "prompts.jsonl")
    line = _refused(tmp_path, monkeypatch, capsys, "prompts.jsonl")
    assert "prompts.jsonl" in line and expected in line, line


def test_too_few_prompts_for_a_heldout_check_name_the_count_or_run_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "few.jsonl").write_text(_jsonl(_rows(20)))
    prompts = load_prompts_file(tmp_path / "few.jsonl")
    sizes = prompts.split_sizes()
    assert sum(sizes.values()) == 20 and min(sizes.values()) < MIN_SPLIT
    line = _refused(tmp_path, monkeypatch, capsys, "few.jsonl")
    counts = f"{sizes['validation']} validation, {sizes['test']} test prompts (of 20 rows"
    assert counts in line and "--no-heldout" in line, line
    check_splits(prompts, 0, heldout=False)  # by flag: a run without a held-out check ...
    assert heldout_note(prompts, 0).startswith("no held-out check was possible: ")  # ... that says so


def test_every_format_loads_the_same_rows_and_splits_by_id(tmp_path: Path) -> None:
    rows = [
        {"id": f"q{i}", "prompt": f"p {i}", "answers": [f"a{i}", "b"], "metric": "rouge" if i % 2 else None}
        for i in range(30)
    ]
    (tmp_path / "p.jsonl").write_text(_jsonl(rows))
    (tmp_path / "p.json").write_text(json.dumps({"metric": "qa_f1", "max_new_tokens": 8, "rows": rows}))
    import pandas as pd

    frame = pd.DataFrame([{**r, "answers": json.dumps(r["answers"])} for r in rows])
    frame.to_csv(tmp_path / "p.csv", index=False)
    pd.DataFrame(rows).to_parquet(tmp_path / "p.parquet")
    loaded = {s: load_prompts_file(tmp_path / f"p{s}") for s in (".jsonl", ".json", ".csv", ".parquet")}
    for suffix, prompts in loaded.items():
        assert [r.id for r in prompts.rows] == [r["id"] for r in rows], suffix
        assert [r.answers for r in prompts.rows] == [tuple(r["answers"]) for r in rows], suffix  # type: ignore[arg-type]
        assert [r.metric for r in prompts.rows] == ["rouge" if i % 2 else "qa_f1" for i in range(30)], suffix
        assert prompts.budget_kind == "gold"
    assert {r.max_new_tokens for r in loaded[".json"].rows} == {8}  # the file-level default
    assert {r.max_new_tokens for r in loaded[".jsonl"].rows} == {None}
    ids = [r.id for r in loaded[".jsonl"].split("validation", 3)]
    assert ids == [r.id for r in split_records(loaded[".jsonl"].rows, "validation", seed=3)]
    assert 0 < len(ids) < 30 and {r.dataset for r in loaded[".jsonl"].rows} == {FILE_DATASET}


def test_rows_without_id_split_by_a_hash_of_the_prompt_and_chat_messages_and_longbench_shape_load(
    tmp_path: Path,
) -> None:
    rows = [
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 1"}]},
        {"prompt": [{"role": "user", "content": "Hi 2"}]},
    ]
    (tmp_path / "chat.jsonl").write_text(_jsonl(rows))
    chat = load_prompts_file(tmp_path / "chat.jsonl")
    assert chat.rows[0].messages == (("system", "Be brief."), ("user", "Hi 1")) and chat.rows[0].text is None
    assert chat.rows[0].id.startswith("h-") and chat.rows[0].id != chat.rows[1].id
    assert chat.budget_kind == "agreement"
    (tmp_path / "lb.jsonl").write_text(_jsonl([{"_id": "x", "context": "C {braces}", "input": "Q?"}]))
    row = load_prompts_file(tmp_path / "lb.jsonl").rows[0]
    assert row.id == "x" and row.text is not None and "C {braces}" in row.text and "Q?" in row.text


def test_a_changed_file_is_another_study(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(_jsonl(_rows(40)))
    first = parse_settings(["--task", str(path)])
    path.write_text(_jsonl(_rows(41)))
    second = parse_settings(["--task", str(path)])
    assert first.name != second.name  # a new study folder, never a silent mix ...
    a, b = first.study_identity(), second.study_identity()
    assert a["task_fingerprint"] != b["task_fingerprint"]  # ... and a named study refuses the other file
    assert a["budget_kind"] == "agreement" and first.max_accuracy_loss == second.max_accuracy_loss


def test_a_task_is_a_prompts_file_only_by_path() -> None:
    assert is_prompts_path("mine.jsonl") and is_prompts_path("x/y.parquet") and not is_prompts_path("qa")
    assert [s.name for s in resolve_task("mine.csv")] == [FILE_DATASET]
    with pytest.raises(ValueError, match="a prompts file is a task on its own"):
        resolve_task("mine.jsonl,qa")


def test_agreement_scores_against_the_unpruned_answer() -> None:
    assert agreement_score("qa_f1", "The answer is Paris", "The answer is Paris") == 1.0
    assert agreement_score("qa_f1", "", "") == 1.0  # an answer agrees with itself, even an empty one
    assert agreement_score("qa_f1", "Paris", "Paris France") == pytest.approx(2 / 3)
    assert agreement_score("qa_f1", "Rome", "Paris") == 0.0


def _study_argv(folder: Path, out: Path, task: Path, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", str(task), "--max-prompt-tokens", "96", "--max-new-tokens", "4",
        "--output", str(out), "--study-name", "s", "--sampler", "random", "--n-trials", "3", "--speedup", "flops",
        "--confirm-k", "2", "--fresh-kl-examples", "0", "--n-examples", "12", "--heldout-n-examples", "10", *extra,
    ]  # fmt: skip


def _file(path: Path, n: int, answers: bool) -> Path:
    rows = [
        {
            "id": f"r{i}",
            "prompt": f"Note {i}: the harbour lamp {i} is red and the gate {i} is blue. What colour is lamp {i}?",
            **({"answers": ["red"]} if answers else {}),
        }
        for i in range(n)
    ]
    path.write_text(_jsonl(rows))
    return path


@pytest.mark.parametrize("answers", [False, True], ids=["agreement", "gold"])
def test_a_study_on_a_prompts_file_says_which_budget_and_scores_by_it(
    answers: bool, tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file without answers is a study in agreement points (the unpruned answers are its references:
    the baseline scores 100 on each prompt), with answers one in gold score points; the console, the
    held-out check, recommended.json and the MLflow run say which."""
    task = _file(tmp_path / "mine.jsonl", 50, answers)
    prompts = load_prompts_file(task)
    assert min(prompts.split_sizes().values()) >= MIN_SPLIT
    assert search(_study_argv(tiny_folder, tmp_path / "runs", task)) == 0
    out = capsys.readouterr().out
    kind, unit = ("agreement", "agreement points") if not answers else ("gold", "score points")
    budget = "Budget: 20 agreement points" if not answers else "Budget: 2 score points"
    assert budget in out and unit in out.split("Held-out check")[1]
    assert answers or "score points" not in out  # every task loss of an agreement study in its points
    study = tmp_path / "runs" / "s"
    cache = json.loads(next((study / "cache").glob("baseline-*.json")).read_text())["entries"]
    scores = {v["score"] for v in cache.values()}
    if not answers:
        assert scores == {1.0}  # each unpruned answer agrees with itself
    else:
        assert scores == {0.0}  # a random-init model never says "red"
    heldout = json.loads((study / "heldout.json").read_text())
    assert heldout["rows"] and all(r["n_test"] == 10 and r["test_loss_unit"] == unit for r in heldout["rows"])
    assert heldout["budget_kind"] == kind
    if not answers:  # a pruned answer that differs from the unpruned one loses agreement points
        assert any(r["test_loss"] > 0 for r in heldout["rows"]), heldout["rows"]
    for path in (study / "pareto").glob("trial-*.json"):
        meta = json.loads(path.read_text())["metadata"]
        assert meta["budget"]["kind"] == kind and meta["settings"]["budget_kind"] == kind
        assert meta["settings"]["task_fingerprint"] == f"{prompts.fingerprint}/cut"
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{study / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = [r for r in client.search_runs(experiments) if r.data.tags.get("lazyllm.budget_kind")]
    assert run.data.tags["lazyllm.budget_kind"] == kind
    assert run.data.params["prompts_file"] == "mine.jsonl" and run.data.params["prompts_rows"] == "50"
    assert run.data.params["prompts_fingerprint"] == prompts.fingerprint
    assert not any("harbour" in v for v in run.data.params.values())  # never the content


def test_long_prompts_are_cut_in_the_middle_or_refused_naming_the_row(
    tiny_folder: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from tuner.evaluation.runner import build_examples
    from tuner.study.settings import EvalSettings

    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    long = " ".join(f"word{i}" for i in range(400))
    rows = [{"id": f"s{i}", "prompt": f"short {i}?"} for i in range(30)] + [{"id": "long", "prompt": long}]
    rows += [
        {
            "id": "chat",
            "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
        }
    ]
    task = tmp_path / "mixed.jsonl"
    task.write_text(_jsonl(rows))
    prompts = load_prompts_file(task)
    split = {r.id: s for s in ("validation", "test") for r in prompts.split(s)}  # type: ignore[arg-type]
    cut = EvalSettings(task=str(task), max_prompt_tokens=64, split=split["long"])
    examples = {ex.record_id: ex for ex in build_examples(cut, tokenizer)}
    kept = tokenizer.decode(examples["long"].input_ids)
    assert len(examples["long"].input_ids) <= 64 and "word0 " in kept and "word399" in kept  # cut in the
    assert "word200" not in kept  # middle to the budget (LongBench's encoding, with the chat template)
    assert examples["long"].by_agreement and examples["long"].max_new_tokens == 32
    refuse = EvalSettings(task=str(task), max_prompt_tokens=64, split=split["long"], long_prompts="refuse")
    with pytest.raises(
        ValueError, match=r"mixed.jsonl: row 31 \(id 'long'\) is longer than --max-prompt-tokens 64"
    ):
        build_examples(refuse, tokenizer)
    chat = EvalSettings(task=str(task), max_prompt_tokens=64, split=split["chat"])
    ids = {ex.record_id: ex for ex in build_examples(chat, tokenizer)}["chat"].input_ids
    want = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}],
        add_generation_prompt=True,
        return_dict=True,
    )["input_ids"]
    assert list(ids) == list(want)  # the messages through the model's chat template, as given


def test_refused_long_prompts_stop_the_cli_before_the_study_folder_exists(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"id": f"s{i}", "prompt": f"short {i}?"} for i in range(60)]  # >= 10 in each split
    rows.insert(17, {"id": "long", "prompt": " ".join(f"word{i}" for i in range(400))})
    (tmp_path / "mixed.jsonl").write_text(_jsonl(rows))
    monkeypatch.chdir(tmp_path)
    args = [
        "--task",
        "mixed.jsonl",
        "--model",
        str(tiny_folder),
        "--max-prompt-tokens",
        "64",
        "--n-trials",
        "1",
    ]
    assert search([*args, "--long-prompts", "refuse"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mixed.jsonl"]  # no runs/ folder
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "mixed.jsonl: row 18 (id 'long') is longer than --max-prompt-tokens 64" in err[0]
    ), err


def test_a_rows_metric_scores_it_and_gold_rows_ignore_the_unpruned_answer() -> None:
    from tuner.data.metrics import rouge_score
    from tuner.evaluation.runner import Example, score_prediction

    def example(answers: tuple[str, ...], metric: str) -> Example:
        return Example(FILE_DATASET, "r", (1, 2), answers, None, 8, (), metric)

    text = "the cat sat on the mat today"
    assert score_prediction(example(("a cat sat on a mat",), "rouge"), text) == rouge_score(
        text, "a cat sat on a mat"
    )
    assert score_prediction(example(("a cat sat on a mat",), "rouge"), text, "zzz") == rouge_score(
        text, "a cat sat on a mat"
    )
    assert score_prediction(example((), "rouge"), text, "a cat sat on a mat") == rouge_score(
        text, "a cat sat on a mat"
    )
    with pytest.raises(ValueError, match="needs the unpruned model's answer"):
        score_prediction(example((), "qa_f1"), text)


def power_line(outcome: StudyOutcome) -> str | None:
    """The power line as a study writes it: the stages decide, the report formats."""
    decision = decide(outcome, TrialTiming(0, 0, None, None))
    return format_power_line(outcome, decision, recommendation_certainty(outcome))


def test_the_power_line_says_what_the_prompts_certify_and_how_many_would_certify_the_budget() -> None:
    import dataclasses
    import math

    from tests.support import decision_outcome

    outcome = decision_outcome(0.4, 8.0, 10.0, 0.5, at_90=25.0)  # KL 0.1: predicted 0.8, bound 2.5 at 90%
    need = math.ceil(13 * ((2.5 - 0.8) / (2.0 - 0.8)) ** 2)
    assert power_line(outcome) == (
        "Power: your 13 validation examples certify a budget of 2.50 score points for the recommendation "
        f"(90% bound); about {need} would certify 2"
    )
    assert outcome.confirmation.calibration.examples_to_certify(0.1, 2.0, at_confidence=True) == need
    certified = decision_outcome(0.4, 8.0, 10.0, 0.5, at_90=15.0)
    assert power_line(certified) == (
        "Power: your 13 validation examples certify a budget of 1.50 score points for the recommendation "
        "(90% bound), within the 2 asked"
    )
    identity = dataclasses.replace(outcome.identity, budget_kind="agreement", task_fingerprint="abc/cut")
    agreement = dataclasses.replace(outcome, identity=identity)
    line = power_line(agreement)
    assert line is not None and "your 13 validation prompts certify a budget of 2.50 agreement points" in line
    assert agreement.budget_line().startswith("Budget: 2 agreement points (no gold answers")


def test_a_keep_all_recommendation_gets_the_power_line_of_the_next_faster_schedule() -> None:
    import dataclasses
    import math

    from tests.support import decision_outcome
    from tuner.stages.confirm import CandidateResult

    outcome = decision_outcome(0.4, 15.0, 25.0, 0.5)  # trial 1 at KL 0.1: predicted 1.5, bound 2.5 at 60%
    assert outcome.confirmation is not None
    keep_all = CandidateResult(0, (0.0, 0.0, 0.0, 0.0), 1.0, 0.0, "confirmed", None, "the unpruned answers")
    refused = dataclasses.replace(outcome.confirmation.candidates[0], status="scored")
    confirmation = dataclasses.replace(outcome.confirmation, candidates=(refused, keep_all))
    outcome = dataclasses.replace(outcome, confirmation=confirmation)
    assert outcome.recommended is not None and outcome.recommended.number == 0
    need = math.ceil(13 * ((2.5 - 1.5) / (2.0 - 1.5)) ** 2)
    assert power_line(outcome) == (
        "Power: your 13 validation examples bound the next faster schedule (trial 1, 1.40x) at 2.50 score "
        f"points (60%), over the 2 asked; about {need} would certify it within 2"
    )


def test_a_prompts_file_keeps_a_fresh_pool_from_the_search(tmp_path: Path) -> None:
    """The validation split's rows of highest hash, up to FRESH_ROWS, are the ``fresh`` split: disjoint
    from the search's validation rows and from test, and never more than leaves the search MIN_SPLIT."""
    from tuner.data.prompts import FRESH, FRESH_MIN, FRESH_ROWS, fresh_pool_size

    assert [fresh_pool_size(n) for n in (0, 10, 13, 14, 20, 22, 40)] == [0, 0, 0, 4, 10, 12, 12]
    assert FRESH_MIN == 4 and FRESH_ROWS == 12
    big = load_prompts_file(_file(tmp_path / "big.jsonl", 200, answers=False))
    parts = {s: {r.id for r in big.split(s)} for s in ("validation", FRESH, "test")}
    assert len(parts[FRESH]) == FRESH_ROWS and big.pool_size() == FRESH_ROWS
    assert set().union(*parts.values()) == {r.id for r in big.rows} and sum(map(len, parts.values())) == 200
    assert big.fresh_note() == "" and big.split("validation") != big.split("validation", seed=1)
    small = load_prompts_file(_file(tmp_path / "small.jsonl", 12, answers=True))
    assert small.pool_size() == 0 and not small.split(FRESH)
    note = small.fresh_note()
    n = len(small.split("validation"))
    assert note == (
        f"no fresh-drift check: small.jsonl's {n} validation rows (of 12) are all the search's; a fresh "
        f"pool of at least {FRESH_MIN} rows the search never reads needs {MIN_SPLIT + FRESH_MIN} or more (add prompts)"
    )
    from tuner.study.settings import SearchSettings

    source = SearchSettings(task=str(tmp_path / "big.jsonl")).fresh_source()
    assert source.kind == "file" and source.settings is not None
    assert (source.settings.split, source.settings.n_examples) == (FRESH, 12)
    assert SearchSettings(task=str(tmp_path / "small.jsonl")).fresh_source().reason == note


def test_a_study_on_a_prompts_file_checks_fresh_drift_on_its_own_rows(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--task FILE`` and no open-QA flag: the fresh-drift check reads rows of the file the search
    never saw, and the confirmation and the decision paragraph say which and how many."""
    task = _file(tmp_path / "mine.jsonl", 80, answers=True)
    prompts = load_prompts_file(task)
    argv = _study_argv(tiny_folder, tmp_path / "runs", task, "--max-accuracy-loss", "100")
    argv[argv.index("--fresh-kl-examples") + 1] = "12"
    assert search(argv) == 0
    study = tmp_path / "runs" / "s"
    fresh = json.loads((study / "confirmation.json").read_text())["fresh"]
    pool = prompts.pool_size()
    validation = pool + prompts.split_sizes()["validation"]
    assert fresh["prompts"] == (
        f"mine.jsonl's own rows: {pool} of the {pool} validation rows of {validation} kept from the search, 96 tokens"
    ), fresh
    assert fresh["n_examples"] == pool > 0 and fresh["kl"]
    paragraph = json.loads((study / "recommended.json").read_text())["metadata"]["decision"]
    assert (
        f"re-measured its front's KL on {pool} prompts the search never saw (mine.jsonl's own rows"
        in paragraph
    )
