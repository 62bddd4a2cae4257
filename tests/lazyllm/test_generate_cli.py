from __future__ import annotations

from pathlib import Path

import pytest

from lazyllm.generate import main
from lazyllm.schedule import Schedule


def test_cli_reports_policy_and_decode_speed(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schedule = Schedule.from_layers("tiny", 4, {1: 50}).save(tmp_path / "s.json")
    args = ["--model", str(tiny_folder), "--schedule", str(schedule), "--allow-other-model"]
    args += ["--prompt", "a b c d e f g h", "--no-chat", "--max-new-tokens", "3"]
    assert main([*args, "--revival", "budget:2", "--compare"]) == 0
    out = capsys.readouterr().out
    assert out.count("revival budget:2") == 1 and "revival dynamic" in out  # the unpruned run: keep-all
    assert "decode " in out and "ms/token" in out and "total speedup" in out
    assert main([*args, "--revival", "sometimes"]) == 2
    assert "revival policy = 'sometimes'" in capsys.readouterr().err


def test_cli_samples_with_a_seed_and_streams(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--do-sample/--seed mean what generate's keywords mean; --stream prints the same answer."""
    from lazyllm.engine import LazyLLM
    from lazyllm.models import load_model

    schedule = Schedule.from_layers("tiny", 4, {1: 50}).with_revival("frozen")
    path = schedule.save(tmp_path / "s.json")
    args = ["--model", str(tiny_folder), "--schedule", str(path), "--allow-other-model", "--no-chat"]
    args += ["--prompt", "a b c d e f g h", "--max-new-tokens", "6", "--do-sample", "--temperature", "1.2"]
    args += ["--top-k", "40", "--top-p", "0.9", "--seed", "5"]
    model, tokenizer = load_model(str(tiny_folder), device="cpu")
    expected = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False).generate(
        "a b c d e f g h", max_new_tokens=6, do_sample=True, temperature=1.2, top_k=40, top_p=0.9, seed=5
    )
    assert main(args) == 0
    blocking = capsys.readouterr().out
    assert main([*args, "--stream"]) == 0
    streamed = capsys.readouterr().out
    for out in (blocking, streamed):
        assert out.startswith(f"--- LazyLLM ---\n{expected.text}\nTTFT ")
        assert "sampled" in out and "TTFT" in out
    assert main([*args, "--top-p", "1.5"]) == 2
    assert "top_p = 1.5: must be in (0, 1]" in capsys.readouterr().err
