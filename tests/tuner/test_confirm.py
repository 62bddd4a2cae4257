"""tuner.confirm and tuner.records: the confirmation stage on a real (tiny) study, and the trial record."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pytest

from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner.confirm import confirm, record_confirmation, write_confirmation
from tuner.records import TrialRecord
from tuner.results import export_study
from tuner.search import main, parse_settings
from tuner.session import open_session
from tuner.study import BaselineStats, recommended_trial


def _argv(folder: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", "hotpotqa,trec", "--n-examples", "2", "--max-prompt-tokens", "96",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "c",
        "--sampler", "random", "--tracking-uri", "none", "--timing-rounds", "2", *extra,
    ]  # fmt: skip


def _raced(folder: Path, out: Path, *, trials: int, k: int) -> list[str]:
    """A study whose every trial is feasible (KL budget 10), ranked by the FLOP model, then confirmed."""
    return _argv(
        folder, out, "--n-trials", str(trials), "--confirm-k", str(k), "--no-heldout", "--max-kl", "10",
        "--speedup", "flops",
    )  # fmt: skip


def test_confirmation_recommends_a_confirmed_schedule_and_records_evidence(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _raced(tiny_folder, tmp_path, trials=3, k=2)
    assert main(argv) == 0
    assert "Confirmation (task score on every validation example)" in capsys.readouterr().out
    d = tmp_path / "c"
    data = json.loads((d / "confirmation.json").read_text())
    # keep-all (KL 0) and the faster pruned trials form the feasible front: two candidates
    assert len(data["candidates"]) == 2 and data["level"] == 0.9 and data["n_examples"] == 4
    statuses = [c["status"] for c in data["candidates"]]
    # racing: the first confirmed candidate ends it, every later one is skipped
    assert statuses[0] == "confirmed" and all(s == "skipped" for s in statuses[1:])
    speeds = [c["speedup"] for c in data["candidates"]]
    assert speeds == sorted(speeds, reverse=True)
    rec = Schedule.load(d / "recommended.json")
    conf = rec.metadata["confirmation"]
    assert conf["trial"] == data["recommended_trial"] and conf["status"] == "confirmed"
    assert conf["task_loss"]["upper"] <= conf["budget"] and conf["task_loss"]["n"] == 4
    rows = json.loads((d / "pareto.json").read_text())
    assert all("confirmation" in r and "accuracy_loss_upper" in r for r in rows)
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    assert study.user_attrs["confirmation"] == data | {"complete_trials": 3}
    assert [r["trial"] for r in rows if r["recommended"]] == [data["recommended_trial"]]

    # the same study against a baseline that scored perfectly: every candidate loses 100 points
    settings = parse_settings(argv)
    session = open_session(settings, progress=False)
    perfect = tuple(dataclasses.replace(b, score=1.0) for b in session.runner.baseline.results)
    session.runner.baseline = BaselineStats.of(perfect)
    failed = confirm(study, session.runner, 2)
    assert failed.recommended is None and {c.status for c in failed.candidates} == {"failed"}
    assert all("budget" in c.reason for c in failed.candidates)
    assert write_confirmation(study, failed, d) is None and not (d / "recommended.json").exists()
    rows = json.loads((d / "pareto.json").read_text())
    assert {r["confirmation"] for r in rows} <= {"failed", "not a candidate"}
    assert not any(r["recommended"] for r in rows)


def test_everything_names_the_confirmed_trial_when_the_fastest_fails(
    tiny_folder: Path, tmp_path: Path
) -> None:
    argv = _raced(tiny_folder, tmp_path, trials=3, k=2)
    assert main(argv) == 0
    d = tmp_path / "c"
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    fastest = recommended_trial(study, 2.0)
    assert fastest is not None
    # the same race, except that the fastest candidate failed and the next one was confirmed
    settings = parse_settings(argv)
    session = open_session(settings, progress=False)
    race = confirm(study, session.runner, 2)
    first, second = race.candidates
    assert first.trial == fastest.number and first.loss is not None
    rejected = dataclasses.replace(
        race,
        candidates=(
            dataclasses.replace(first, status="failed"),
            dataclasses.replace(second, status="confirmed", loss=first.loss),
        ),
    )
    record_confirmation(study, rejected)
    export_study(study, d, 2.0)
    assert write_confirmation(study, rejected, d) == d / "recommended.json"
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    picked = recommended_trial(study, 2.0)
    assert picked is not None and picked.number == second.trial != fastest.number
    rows = json.loads((d / "pareto.json").read_text())
    assert [r["trial"] for r in rows if r["recommended"]] == [second.trial]
    assert Schedule.load(d / "recommended.json").metadata["trial"] == second.trial
    # a later trial makes the confirmation stale: back to the fastest feasible until it is rerun
    study.enqueue_trial({"n_stages": 0})
    assert main(_raced(tiny_folder, tmp_path, trials=4, k=0)) == 0
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    again = recommended_trial(study, 2.0)
    assert again is not None and again.number == fastest.number


def test_trial_record_round_trip_and_feasibility(tiny_folder: Path, tmp_path: Path) -> None:
    assert (
        main(
            _argv(
                tiny_folder,
                tmp_path,
                "--n-trials",
                "2",
                "--confirm-k",
                "0",
                "--no-heldout",
                "--max-kl",
                "0.05",
            )
        )
        == 0
    )
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{tmp_path / 'c' / 'study.db'}")
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):  # the peers' warm starts wait
        record = TrialRecord.from_trial(t)
        assert record is not None and TrialRecord.from_dict(record.to_dict()) == record
        assert record.accuracy == "fidelity" and record.loss.n == 4 and len(record.per_example) == 4
        assert record.speed is not None and record.speed.rounds >= 2
        assert (record.speedup, record.loss.value) == tuple(t.values)
        # the constraint the samplers see is the one-sided upper bound minus the budget
        assert t.constraints["accuracy_loss"] == record.loss.upper - 0.05
        assert record.feasible(0.05) == (t.constraints["accuracy_loss"] <= 0)
        flat = record.flat_metrics()
        assert {"accuracy_loss_upper", "accuracy_loss_low", "top1", "flop_speedup"} <= set(flat)
    pruned = TrialRecord.from_trial(study.trials[1])
    assert pruned is not None and pruned.loss.upper > pruned.loss.value  # so the bound is what is used
    with pytest.raises(ValueError, match="accuracy"):
        dataclasses.replace(pruned, accuracy="bogus")
