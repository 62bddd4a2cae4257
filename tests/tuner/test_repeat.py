"""The README's time-budget caveat, tested: ``--trials-timeout none --n-trials N`` makes a study repeat
exactly (same trials, same values, same pick) on the same machine, with the default FLOP speedup."""

from __future__ import annotations

import json
from pathlib import Path

import optuna

from tests.support import longbench_dir
from tuner.search import main


def _run(folder: Path, out: Path) -> tuple[list[tuple[dict[str, object], list[float]]], object]:
    argv = [
        "--model", str(folder), "--task", "hotpotqa,trec", "--n-examples", "1", "--max-prompt-tokens", "128",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "s",
        "--trials-timeout", "none", "--n-trials", "14", "--no-heldout", "--tracking-uri", "none",
    ]  # fmt: skip
    assert main(argv) == 0
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{out / 's' / 'study.db'}")
    trials = [(t.params, list(t.values or [])) for t in study.get_trials() if t.state.is_finished()]
    return trials, json.loads((out / "s" / "recommended.json").read_text())["percentiles"]


def test_a_study_of_n_trials_without_a_time_budget_repeats_exactly(tiny_folder: Path, tmp_path: Path) -> None:
    first, second = _run(tiny_folder, tmp_path / "a"), _run(tiny_folder, tmp_path / "b")
    assert len(first[0]) == 14 and first == second  # the warm starts and then the sampler's own trials
