"""Keep-all is the study's reference: evaluated once (the first trial), and never a point the sampler
can propose again, so no proposal of a real TPE study is spent on a refused keep-all duplicate."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.samplers import RandomSampler
from optuna.trial import FixedTrial

from lazyllm.schedule import Schedule
from tests.support import longbench_dir, n_warm_starts
from tuner.search import main
from tuner.stages.front import study_records
from tuner.study.spaces import load_space
from tuner.study.spaces.base import KEEP_ALL_ATTR
from tuner.study.workers import DUPLICATE_ATTR


def test_keep_all_is_the_reference_trial_and_no_point_of_the_space() -> None:
    space = load_space("stages")
    reference = optuna.create_study()
    reference.enqueue_trial({}, user_attrs={KEEP_ALL_ATTR: True})
    trial = reference.ask()
    assert space.trial_schedule(trial, "m", 30) == Schedule.keep_all("m", 30) and trial.params == {}
    # every sampled point prunes: n_stages = 0 is outside what the sampler is offered
    draws = optuna.create_study(sampler=RandomSampler(seed=0))
    for _ in range(200):
        assert space.trial_schedule(draws.ask(), "m", 30).prunes
    assert all(t.params["n_stages"] >= 1 for t in draws.trials)
    # a study stored before still reads its keep-all trial back
    assert space.to_schedule({"n_stages": 0}, "m", 30) == Schedule.keep_all("m", 30)
    assert space.trial_schedule(FixedTrial({"n_stages": 2, "stage0_layer": 3, "stage0_pct": 50.0,
                                            "stage1_layer": 9, "stage1_pct": 50.0,
                                            "scoring": "w1-softmax-none-mean"}), "m", 30).prunes  # fmt: skip


def test_a_tpe_study_evaluates_keep_all_once_and_never_reproposes_it(
    tiny_folder: Path, tmp_path: Path
) -> None:
    n_trials = n_warm_starts() + 16  # the warm starts, then two dozen of the sampler's own proposals
    argv = [
        "--model", str(tiny_folder), "--task", "hotpotqa,trec", "--n-examples", "1", "--max-prompt-tokens", "96",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(tmp_path), "--study-name", "s",
        "--sampler", "tpe", "--tracking-uri", "none", "--speedup", "flops", "--max-kl", "10",
        "--n-trials", str(n_trials), "--confirm-k", "0", "--no-heldout",
    ]  # fmt: skip
    assert main(argv) == 0
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    keep_all = [r.number for r in study_records(study) if not r.schedule.prunes]
    assert keep_all == [0]
    refused = [t.system_attrs[DUPLICATE_ATTR] for t in study.trials if DUPLICATE_ATTR in t.system_attrs]
    assert 0 not in refused  # no proposal was refused as the keep-all trial's schedule
    assert all(t.params["n_stages"] >= 1 for t in study.trials[1:])
