from __future__ import annotations

from pathlib import Path

import pytest

from lazyllm.generate import main


def test_cli_reports_policy_and_decode_speed(tiny_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", str(tiny_folder), "--prompt", "a b c d e f g h", "--no-chat", "--max-new-tokens", "3"]
    assert main([*args, "--revival", "budget:2", "--compare"]) == 0
    out = capsys.readouterr().out
    assert out.count("revival budget:2") == 1 and "revival dynamic" in out  # the unpruned run: keep-all
    assert "decode " in out and "ms/token" in out and "total speedup" in out
    assert main([*args, "--revival", "sometimes"]) == 2
    assert "revival policy = 'sometimes'" in capsys.readouterr().err
