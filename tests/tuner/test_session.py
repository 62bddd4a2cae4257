"""tuner.session: the stages run in order and every output is written once, after they all ran.

A run stopped during confirmation leaves no unconfirmed ``recommended.json`` (the files are written
from the finished outcome only), and an output a run regenerates, truncated by an earlier crash, never
blocks a rerun.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner import session as session_module
from tuner.search import main


def _argv(folder: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", "hotpotqa,trec", "--n-examples", "1", "--max-prompt-tokens", "96",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "s",
        "--sampler", "random", "--tracking-uri", "none", "--speedup", "flops", "--max-kl", "10", *extra,
    ]  # fmt: skip


def test_ctrl_c_during_confirmation_leaves_no_unconfirmed_recommendation(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_confirm = session_module.confirm
    calls: list[int] = []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise KeyboardInterrupt  # Ctrl-C while the candidates are being re-scored

    monkeypatch.setattr(session_module, "confirm", interrupted)
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "2", "--no-heldout")) == 130
    study_dir = tmp_path / "s"
    assert calls and not (study_dir / "recommended.json").exists()
    assert not (study_dir / "pareto.json").exists()  # nothing is written before the outcome is whole
    # the rerun confirms, then writes: the recommendation carries its confirmation
    monkeypatch.setattr(session_module, "confirm", real_confirm)
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "2", "--no-heldout")) == 0
    rec = Schedule.load(study_dir / "recommended.json")
    assert rec.metadata["status"] == "confirmed" and rec.metadata["confirmation"]["status"] == "confirmed"
    # stopped during the next run's confirmation: the confirmed file of the last whole run stays
    monkeypatch.setattr(session_module, "confirm", interrupted)
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "3", "--no-heldout")) == 130
    assert Schedule.load(study_dir / "recommended.json").metadata["status"] == "confirmed"


def test_a_truncated_output_never_blocks_a_rerun(tiny_folder: Path, tmp_path: Path) -> None:
    """Defect: a truncated heldout.json failed every rerun with "Unterminated string" naming no file."""
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "2", "--confirm-k", "0")) == 0
    study_dir = tmp_path / "s"
    for name in ("heldout.json", "pareto.json", "confirmation.json", "recommended.json"):
        (study_dir / name).write_text('{"rows": [{"schedule": "recomm')
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "3", "--confirm-k", "0")) == 0
    heldout = json.loads((study_dir / "heldout.json").read_text())
    assert [r["schedule"].split(" (")[0] for r in heldout["rows"]] == [
        "recommended",
        "best paper-style",
        "best one-stage",
    ]
    assert json.loads((study_dir / "pareto.json").read_text())
    assert Schedule.load(study_dir / "recommended.json").metadata["status"] == "provisional"
