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
