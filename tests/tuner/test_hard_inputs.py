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


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model"):
        search([*_search_argv(Path("no-such-model"), tmp_path, longbench_dir()), "--debug"])


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
