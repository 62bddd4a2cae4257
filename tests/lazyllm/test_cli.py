"""lazyllm.cli.cli_main: the one error wrapper of every entry point."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lazyllm.cli import cli_main, one_line
from lazyllm.models import ModelLoadError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--n", type=int, default=1)
    return p


def _raise(exc: BaseException):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        raise exc

    return run


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (ValueError("n = 0: must be >= 1\nsecond line"), "error: n = 0: must be >= 1"),
        (ModelLoadError("cannot fetch 'm'; pass a folder"), "error: cannot fetch 'm'; pass a folder"),
        (
            FileNotFoundError(2, "No such file or directory", "s.json"),
            "error: s.json: No such file or directory",
        ),
        (ValueError(""), "error: ValueError"),
    ],
)
def test_user_errors_are_one_line_exit_2(
    exc: BaseException, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(_parser(), _raise(exc), []) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_debug_shows_the_traceback_and_bugs_keep_theirs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 32: bad input is still exit 2 with --debug; the traceback is shown, masked
    secret = ValueError("bad http://TOKEN@h")
    mask = lambda s: s.replace("TOKEN", "***")  # noqa: E731
    assert cli_main(_parser(), _raise(secret), ["--debug"], redact=mask) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "TOKEN" not in err
    assert err.splitlines()[-1] == "error: bad http://***@h"
    monkeypatch.setenv("LAZYLLM_DEBUG", "1")
    assert cli_main(_parser(), _raise(ValueError("bad")), []) == 2
    assert "Traceback" in capsys.readouterr().err
    assert cli_main(_parser(), _raise(KeyboardInterrupt()), []) == 130
    monkeypatch.delenv("LAZYLLM_DEBUG")
    with pytest.raises(KeyError):  # not the user's input: a bug, shown as such
        cli_main(_parser(), _raise(KeyError("x")), [])


def test_interrupt_and_success(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(_parser(), _raise(KeyboardInterrupt()), [], interrupted="stopped; rerun to resume") == 130
    assert capsys.readouterr().err.strip() == "stopped; rerun to resume"
    assert cli_main(_parser(), lambda args: args.n + 6, ["--n", "1"]) == 7
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # once interrupted, the exit is not


_SECOND_PRESS = """
import argparse, os, signal, sys, time
from lazyllm.cli import cli_main

def run(args):
    raise KeyboardInterrupt

rc = cli_main(argparse.ArgumentParser(), run, [], interrupted="stopped")
os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C again while the command ends
time.sleep(0.2)
sys.exit(rc)
"""


def test_a_second_interrupt_while_ending_keeps_exit_130(tmp_path: Path) -> None:
    """A real process and a real signal: the second SIGINT lands after the first was handled."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", _SECOND_PRESS], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip() == "stopped"  # no traceback


def test_secrets_are_masked_in_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    exc = ValueError("cannot open postgresql://bob:hunter2@db/optuna: timeout")
    assert cli_main(_parser(), _raise(exc), [], redact=lambda s: s.replace("hunter2", "***")) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and "bob:***@db" in err
    assert one_line(exc) == "cannot open postgresql://bob:hunter2@db/optuna: timeout"
