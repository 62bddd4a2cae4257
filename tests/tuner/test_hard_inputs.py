"""Bad input fails in the first seconds with one line naming the problem and the fix (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lazyllm import generate as generate_cli
from lazyllm.engine import LazyLLM
from lazyllm.schedule import Schedule
from tests.support import longbench_dir, make_tiny
from tuner.search import main as search


def _search_argv(folder: Path, out: Path, data: str, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", "hotpotqa", "--n-examples", "1", "--max-prompt-tokens", "64",
        "--max-new-tokens", "2", "--data-dir", data, "--output", str(out), "--n-trials", "1", "--no-heldout",
        "--tracking-uri", "none", *extra,
    ]  # fmt: skip


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "expected an error message"
    assert not any(line.startswith("Traceback") for line in err)
    return err[-1]


def test_unwritable_output(tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert search(_search_argv(tiny_folder, blocker, longbench_dir())) == 2
    assert "is not writable" in _err(capsys)


def test_empty_data_folder(tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert search(_search_argv(tiny_folder, tmp_path / "out", str(empty))) == 2
    assert str(empty) in _err(capsys)


def test_corrupt_jsonl_line_is_named(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    lines = Path(longbench_dir(), "hotpotqa.jsonl").read_text().splitlines()[:3]
    lines[1] = lines[1][: len(lines[1]) // 2]  # cut a record in half
    (data / "hotpotqa.jsonl").write_text("\n".join(lines) + "\n")
    for name in ("dataset2prompt.json", "dataset2maxlen.json"):
        shutil.copy(Path(longbench_dir(), name), data / name)
    assert search(_search_argv(tiny_folder, tmp_path / "out", str(data))) == 2
    assert "hotpotqa.jsonl:2" in _err(capsys)


def test_unknown_model_alias(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _search_argv(Path("no-such-model"), tmp_path, longbench_dir())
    assert search(argv) == 2
    assert "unknown model 'no-such-model'" in _err(capsys)


def test_debug_shows_the_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert search([*_search_argv(Path("no-such-model"), tmp_path, longbench_dir()), "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "error: unknown model" in err


def test_schedule_for_another_model(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schedule = Schedule.keep_all("smollm2-135m", 30).save(tmp_path / "s.json")
    argv = [
        "--model",
        str(tiny_folder),
        "--schedule",
        str(schedule),
        "--prompt",
        "hi",
        "--max-new-tokens",
        "2",
    ]
    assert generate_cli.main(argv) == 2
    line = _err(capsys)
    assert "30 layers, but model" in line and "has 4 layers" in line
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "lazyllm-schedule", "version": 1, "model": "m", "num_layers": 2,
                               "percentiles": [120, 0]}))  # fmt: skip
    assert generate_cli.main([*argv[:2], "--schedule", str(bad), "--prompt", "hi"]) == 2
    assert "percentiles[0] = 120" in _err(capsys)


def test_prompt_longer_than_the_model_limit_is_cut_in_the_middle() -> None:
    model = make_tiny("llama")  # max_position_embeddings = 512
    ids = torch.randint(0, 97, (1, 600), generator=torch.Generator().manual_seed(0))
    engine = LazyLLM(model, Schedule.keep_all("tiny-llama", 5))
    with pytest.warns(UserWarning, match="cut in the middle to 504 tokens"):
        result = engine.generate(ids, max_new_tokens=8, eos_token_id=[])
    assert result.prompt_tokens == 504 and len(result.token_ids) == 8
    cut = torch.cat([ids[:, :252], ids[:, -252:]], dim=1)
    assert engine.generate(cut, max_new_tokens=8, eos_token_id=[]).token_ids == result.token_ids


# ---- issue 11: every bad value refused before any state is written; secrets never printed ----------


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--max-accuracy-loss", "nan"], "max_accuracy_loss = nan: must be a finite number"),
        (["--max-accuracy-loss", "inf"], "max_accuracy_loss = inf: must be a finite number"),
        (["--max-accuracy-loss", "-1"], "max_accuracy_loss = -1.0: must be >= 0"),
        (["--trials-timeout", "nan"], "trials_timeout = nan: must be a finite number"),
        (["--timeout", "inf"], "trials_timeout = inf: must be a finite number"),
        (["--trials-timeout", "0"], "trials_timeout = 0.0: must be > 0"),
        (["--task", "bogus"], "Unknown task 'bogus'"),
    ],
)
def test_bad_settings_write_nothing(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], fragment: str
) -> None:
    out = tmp_path / "out"
    assert search([*_search_argv(tiny_folder, out, longbench_dir()), *flags]) == 2
    assert fragment in _err(capsys)
    assert not out.exists()


def test_bad_data_or_space_write_nothing(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (
        search(
            [*_search_argv(tiny_folder, out, str(empty)), "--tracking-uri", "sqlite:///" + str(out / "m.db")]
        )
        == 2
    )
    assert str(empty) in _err(capsys)
    space = tmp_path / "space.yaml"
    space.write_text("kind: stages\nmax_stages: [1, 2\n")  # malformed YAML
    assert search([*_search_argv(tiny_folder, out, longbench_dir()), "--search-space", str(space)]) == 2
    assert f"search space file {space} is not valid YAML" in _err(capsys)
    space.write_text("kind: stages\nmax_stages: many\n")  # valid YAML, bad value
    assert search([*_search_argv(tiny_folder, out, longbench_dir()), "--search-space", str(space)]) == 2
    assert str(space) in _err(capsys)
    assert not out.exists()


def test_search_space_path_gives_a_valid_study_name(tmp_path: Path) -> None:
    from tuner.search import parse_settings
    from tuner.study.settings import SearchSettings

    for given, stem in (("spaces/my.yaml", "my"), ("odd dir/my space!.yml", "my-space")):
        s = parse_settings(["--search-space", given, "--output", str(tmp_path)])
        assert s.name == f"smollm2-135m-qa-{stem}"
        assert s.study_dir == tmp_path / s.name and s.study_dir.parent == tmp_path
        assert SearchSettings(study_name=s.name).name == s.name  # what --study-name itself accepts


def test_storage_password_never_printed_and_unreachable_storage_writes_nothing(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    url = "postgresql+psycopg://bob:hunter2@127.0.0.1:9/lazyllm"  # nothing listens on port 9
    assert search([*_search_argv(tiny_folder, out, longbench_dir()), "--storage", url]) == 2
    captured = capsys.readouterr()
    assert "hunter2" not in captured.out + captured.err
    assert "cannot reach Optuna storage postgresql+psycopg://bob:***@127.0.0.1:9/lazyllm" in captured.err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--storage", "--tracking-uri"])
def test_a_text_file_as_sqlite_store_is_one_line(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    out = tmp_path / "out"
    assert search([*_search_argv(tiny_folder, out, longbench_dir()), flag, f"sqlite:///{text}"]) == 2
    assert f"{text} is not a SQLite database; pass another {flag}" in _err(capsys)
    assert text.read_text() == "not a database\n" and not out.exists()


def test_prompt_checks(tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--model", str(tiny_folder), "--max-new-tokens", "2"]
    assert generate_cli.main([*base, "--prompt", " \n\t "]) == 2
    assert "--prompt is empty or only whitespace" in _err(capsys)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    assert generate_cli.main([*base, "--prompt-file", str(blank)]) == 2
    assert f"--prompt-file {blank} is empty" in _err(capsys)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    assert generate_cli.main([*base, "--prompt-file", str(latin)]) == 2
    assert f"--prompt-file {latin} is not UTF-8 text" in _err(capsys)


def test_long_prompt_warning_names_the_caller() -> None:
    model = make_tiny("llama")  # max_position_embeddings = 512
    ids = torch.randint(0, 97, (1, 600), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="cut in the middle") as record:
        LazyLLM(model, Schedule.keep_all("tiny-llama", 5)).generate(ids, max_new_tokens=2, eos_token_id=[])
    assert [Path(r.filename).resolve() for r in record] == [Path(__file__).resolve()]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("kind: stages\nmax_stages: " + "[" * 3000 + "]" * 3000 + "\n", "not a flat mapping"),
        ("kind: stages\nkind: parametric\n", "key 'kind' is given twice"),
        ("kind: stages\n" + "#" * 200_000 + "\n", "a search space is at most 100000"),
        ("\ufeffkind: stages\nmax_stages: many\n", "max_stages"),  # a BOM is read past
    ],
)
def test_search_space_file_limits(tmp_path: Path, text: str, fragment: str) -> None:
    from tuner.study.spaces import load_space

    path = tmp_path / "space.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match="search space file") as err:
        load_space(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)
