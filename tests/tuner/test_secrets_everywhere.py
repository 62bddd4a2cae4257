"""Issue 32: ``grep -r`` of a secret across every output of a study run finds nothing, for each
secret form (http(s) userinfo with or without a password, the documented query parameters)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import longbench_dir

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("SeCrEtPw1", "SeCrEtTk2", "SeCrEtSg3")


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "tuner.search", *argv], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def _grep(folder: Path, secret: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def _argv(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(model), "--task", "hotpotqa", "--n-examples", "1", "--max-prompt-tokens", "64",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--n-trials", "2",
        "--speedup", "flops", "--study-name", "s", *extra,
    ]  # fmt: skip


def test_a_study_with_secret_query_parameters_stores_and_prints_none(
    tiny_folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    (out / "s").mkdir(parents=True)
    storage = f"sqlite:///{out / 's' / 'study.db'}?sslpassword={SECRETS[0]}"
    proc = _run(_argv(tiny_folder, out, "--storage", storage, "--no-heldout", "--confirm-k", "1"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sslpassword=***" in proc.stdout  # the console's study line names the store, masked
    assert SECRETS[0] not in proc.stdout + proc.stderr
    assert _grep(out, SECRETS[0]) == []  # study.db, mlflow.db (params, tags), every JSON and HTML file


@pytest.mark.parametrize(
    ("flag", "url"),
    [
        ("--storage", f"http://{SECRETS[1]}@127.0.0.1:1"),
        ("--tracking-uri", f"http://{SECRETS[1]}@127.0.0.1:1"),
        ("--tracking-uri", f"https://{SECRETS[1]}:x-oauth-basic@127.0.0.1:1"),
        ("--storage", f"postgresql://u:p@127.0.0.1:1/db?api_key={SECRETS[1]}&sig={SECRETS[2]}"),
    ],
)
def test_an_unusable_url_with_a_secret_prints_none_even_with_debug(
    tmp_path: Path, flag: str, url: str
) -> None:
    out = tmp_path / "out"
    proc = _run(["--task", "hotpotqa", "--data-dir", longbench_dir(), "--output", str(out), flag, url, "--debug"],
                tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: " in proc.stderr and "Traceback" in proc.stderr
    for secret in SECRETS:
        assert secret not in proc.stdout + proc.stderr, proc.stderr
    assert not out.exists()
