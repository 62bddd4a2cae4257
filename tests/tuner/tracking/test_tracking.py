"""MLflow tracking against a real `mlflow server` (SQLite backend) on a free 127.0.0.1 port."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from lazyllm.schedule import Schedule
from tests.support import (
    assert_evaluated_once,
    audited,
    hand_record,
    longbench_dir,
    n_warm_starts,
    wait_for_http,
)
from tuner import export as export_cli
from tuner.evaluation.losses import Budget, FidelityLoss, ScoreLoss
from tuner.search import main
from tuner.stages.confirm import CandidateResult, Confirmation
from tuner.stages.outcome import StudyOutcome
from tuner.statistics.bootstrap import Estimate
from tuner.statistics.calibration import Calibration
from tuner.study.identity import StudyIdentity
from tuner.study.records import TrialRecord
from tuner.study.settings import SearchSettings
from tuner.study.workers import DuplicateSchedule, never_ran
from tuner.tracking.runs import EXPERIMENT, EXPERIMENT_KIND, Tracker, end_open_runs, trial_counts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    cmd = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
        "--workers", "1",
    ]  # fmt: skip
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(uri + "/health", proc, root / "server.log", what="mlflow server", timeout=120)
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _argv(folder: Path, out: Path, uri: str, n: int) -> list[str]:
    return [
        "--model", str(folder), "--task", "hotpotqa,trec", "--n-examples", "1", "--max-prompt-tokens", "128",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "tracked",
        "--sampler", "random", "--n-trials", str(n), "--no-heldout", "--tracking-uri", uri,
        "--accuracy", "score",  # the task-score metrics below exist only with --accuracy score
    ]  # fmt: skip


def _runs(client: MlflowClient) -> tuple[list, list]:
    exp = client.get_experiment_by_name(EXPERIMENT)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("lazyllm.role") == "study"]
    children = [r for r in runs if r.data.tags.get("lazyllm.role") == "trial"]
    return parents, children


def _ms(trial: optuna.trial.FrozenTrial, attr: str) -> int:
    return int(getattr(trial, attr).timestamp() * 1000)


def test_study_logged_to_server(tiny_folder: Path, tmp_path: Path, mlflow_server: str) -> None:
    assert main(_argv(tiny_folder, tmp_path, mlflow_server, 2)) == 0
    client = MlflowClient(tracking_uri=mlflow_server)
    parents, children = _runs(client)
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.run_name == "tracked" and parent.data.tags["model"] == str(tiny_folder)
    # the study reached its count: the parent is ended, FINISHED, and its counts agree with the children
    assert parent.info.status == "FINISHED" and parent.info.end_time is not None
    m = parent.data.metrics
    assert m["n_trials"] == 2 and m["finished_trials"] == 2 and m["complete_trials"] == 2
    assert m["pruned_trials"] == 0 and m["failed_trials"] == 0
    assert "n_trials" not in parent.data.params and "speedup" not in parent.data.params
    assert parent.data.params["speedup_kind"] == "flops"
    assert parent.data.params["storage"] == f"sqlite:///{(tmp_path / 'tracked' / 'study.db').resolve()}"
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    study = optuna.load_study(study_name="tracked", storage=f"sqlite:///{tmp_path / 'tracked' / 'study.db'}")
    assert study.metric_names == ["speedup", "accuracy_loss"]  # Optuna's names are MLflow's names
    front = json.loads((tmp_path / "tracked" / "pareto.json").read_text())
    assert {"speedup", "accuracy_loss", "speedup_kind"} <= set(front[0])
    by_number = {t.number: t for t in study.get_trials()}
    for child in children:
        trial = by_number[int(child.data.tags["optuna.trial"])]
        # the run spans the trial's real start and end, not the moment it was logged
        assert child.info.start_time == _ms(trial, "datetime_start")
        assert child.info.end_time == _ms(trial, "datetime_complete")
        m = child.data.metrics
        assert {"speedup", "accuracy_loss", "score", "baseline_score", "flop_speedup", "prompt_computed_pct",
                "loss.hotpotqa", "loss.trec", "wall_time_s"} <= set(m)  # fmt: skip
        assert (m["speedup"], m["accuracy_loss"]) == tuple(trial.values)
        assert (
            child.data.params["search_space"] == "stages" and child.data.params["max_prompt_tokens"] == "128"
        )
        assert child.data.params["speedup_kind"] == "flops"
        assert child.info.status == "FINISHED"
        schedule = Schedule.from_mlflow(child.info.run_id, tracking_uri=mlflow_server)
        assert schedule.num_layers == 4 and schedule.metadata["trial"] == int(child.data.tags["optuna.trial"])
    parent_files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {
        "pareto.json",
        "pareto.csv",
        "recommended.json",
        "pareto.png",
        "keep_curves.png",
        "pareto",
    } <= parent_files
    best = study.trials[int(parent.data.metrics["recommended.trial"])]
    assert parent.data.metrics["recommended.speedup"] == best.values[0]

    # resume: opening the study reopens the same parent (RUNNING); the run ends FINISHED with one more child
    settings = SearchSettings(model=str(tiny_folder), task="hotpotqa,trec", output=str(tmp_path),
                              study_name="tracked", n_trials=3)  # fmt: skip
    tracker = Tracker(mlflow_server, settings, study, Budget.from_settings(settings))
    assert tracker.parent_id == parent.info.run_id
    assert client.get_run(parent.info.run_id).info.status == "RUNNING"
    assert main(_argv(tiny_folder, tmp_path, mlflow_server, 3)) == 0
    parents, children = _runs(client)
    assert len(parents) == 1 and len(children) == 3
    assert parents[0].info.status == "FINISHED" and parents[0].data.metrics["finished_trials"] == 3

    # export a trial's schedule straight from its run
    out = tmp_path / "from-run.json"
    assert (
        export_cli.main(
            ["--mlflow-run", children[0].info.run_id, "--out", str(out), "--tracking-uri", mlflow_server]
        )
        == 0
    )
    assert Schedule.load(out).num_layers == 4


def _toy(
    tmp_path: Path, storage: str | None = None, n_trials: int = 3
) -> tuple[SearchSettings, optuna.Study, str]:
    """Settings, an in-memory study and a SQLite MLflow store for Tracker tests without a model."""
    settings = SearchSettings(model="toy", output=str(tmp_path), study_name="toy", n_trials=n_trials,
                              storage=storage)  # fmt: skip
    study = optuna.create_study(study_name="toy", directions=["maximize", "minimize"])
    study.set_user_attr("identity", settings.study_identity())
    return settings, study, f"sqlite:///{tmp_path / 'mlflow.db'}"


def _children(tracker: Tracker) -> dict[int, Any]:
    return {int(r.data.tags["optuna.trial"]): r for r in tracker.child_runs()}


def test_failed_and_interrupted_trials_get_failed_runs(tmp_path: Path) -> None:
    settings, study, uri = _toy(tmp_path)
    tracker = Tracker(uri, settings, study, Budget.from_settings(settings))

    def broken(trial: optuna.Trial) -> tuple[float, float]:
        raise RuntimeError("CUDA out of memory")

    # a failure Optuna catches: the callback logs it
    study.optimize(broken, n_trials=1, catch=(RuntimeError,), callbacks=[tracker.callback])
    runs = _children(tracker)
    assert runs[0].info.status == "FAILED" and runs[0].data.tags["optuna.state"] == "FAIL"

    # Ctrl-C in the middle of a trial: Optuna marks it FAIL and no callback runs; the CLI's hook ends
    # the parent KILLED and gives the interrupted trial its FAILED run
    def interrupted(trial: optuna.Trial) -> tuple[float, float]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        study.optimize(interrupted, n_trials=1, callbacks=[tracker.callback])
    assert 1 not in _children(tracker)
    end_open_runs("KILLED", "interrupted (Ctrl-C)")
    runs = _children(tracker)
    assert runs[1].info.status == "FAILED"
    parent = tracker.client.get_run(tracker.parent_id)
    assert parent.info.status == "KILLED" and parent.data.tags["lazyllm.end_reason"] == "interrupted (Ctrl-C)"
    assert parent.data.metrics["failed_trials"] == 2 and parent.data.metrics["finished_trials"] == 0

    # a resume reopens the parent; nothing is logged twice
    again = Tracker(uri, settings, study, Budget.from_settings(settings))
    assert again.parent_id == tracker.parent_id
    assert again.client.get_run(again.parent_id).info.status == "RUNNING"
    assert sorted(_children(again)) == [0, 1] and len(again.child_runs()) == 2
    end_open_runs("FAILED", "error: something broke")
    assert again.client.get_run(again.parent_id).info.status == "FAILED"


def test_a_ctrl_c_during_a_trials_write_waits_for_it_and_leaves_the_store_unlocked(tmp_path: Path) -> None:
    """A real SIGINT sent right after the child run's first INSERT (its transaction open, the SQLite
    lock held): the write finishes, then Ctrl-C ends the optimize; the run is whole and no lock is left
    (a half-done transaction of our own made every later write wait out MLflow's 20 s busy timeout)."""
    settings, study, uri = _toy(tmp_path)
    tracker = Tracker(uri, settings, study, Budget.from_settings(settings))
    fired: list[str] = []

    def ctrl_c_mid_write(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("INSERT INTO params") and not fired:
            fired.append(statement)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, inside the write

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "after_cursor_execute", ctrl_c_mid_write)
    try:
        with pytest.raises(KeyboardInterrupt):
            study.optimize(lambda trial: (1.5, 0.0), n_trials=2, callbacks=[tracker.callback])
    finally:
        sqlalchemy.event.remove(sqlalchemy.engine.Engine, "after_cursor_execute", ctrl_c_mid_write)
    assert fired and len(study.trials) == 1  # the press stopped the study after its first trial
    with sqlite3.connect(tmp_path / "mlflow.db", timeout=0) as free:  # no waiting: the lock is free
        free.execute("BEGIN IMMEDIATE")
        free.rollback()
    run = _children(tracker)[0]
    assert run.info.status == "FINISHED" and run.data.params["sampler"] == settings.sampler
    end_open_runs("KILLED", "interrupted (Ctrl-C)")
    assert tracker.client.get_run(tracker.parent_id).info.status == "KILLED"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_experiment_opens_on_its_runs_in_the_mlflow_ui(tmp_path: Path) -> None:
    # MLflow's UI picks the experiment's landing view from this tag: runs, not the GenAI traces
    settings, study, uri = _toy(tmp_path)
    Tracker(uri, settings, study, Budget.from_settings(settings))
    store = MlflowClient(tracking_uri=uri)  # read back from the store itself, not the tracker
    experiment = store.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert EXPERIMENT_KIND == {"mlflow.experimentKind": "custom_model_development"}

    # an experiment an older version created without the tag gets it when a study opens it again
    older = tmp_path / "older"
    older.mkdir()
    settings, study, uri = _toy(older)
    MlflowClient(tracking_uri=uri).create_experiment(EXPERIMENT)
    Tracker(uri, settings, study, Budget.from_settings(settings))
    experiment = MlflowClient(tracking_uri=uri).get_experiment_by_name(EXPERIMENT)
    assert experiment is not None and experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_refused_duplicates_get_no_run_and_runs_span_their_trials(tmp_path: Path) -> None:
    settings, study, uri = _toy(tmp_path)
    tracker = Tracker(uri, settings, study, Budget.from_settings(settings))

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        if trial.number == 1:  # as TrialRunner refuses a schedule the study already holds
            trial.storage.set_trial_system_attr(trial._trial_id, "duplicate_of", 0)
            raise DuplicateSchedule("the schedule of trial 0")
        return 1.5, 0.0

    study.optimize(objective, n_trials=3, callbacks=[tracker.callback], catch=(DuplicateSchedule,))
    runs = _children(tracker)
    assert sorted(runs) == [0, 2]  # the refused proposal never ran: no run, not a failure
    assert trial_counts(study)["failed_trials"] == 0 and tracker.sync_failed() == []
    # a refusal is no failure in Optuna's views either (dashboard, CLI): PRUNED, and not counted
    assert study.trials[1].state == optuna.trial.TrialState.PRUNED
    assert trial_counts(study) == {
        "finished_trials": 2,
        "complete_trials": 2,
        "pruned_trials": 0,
        "failed_trials": 0,
    }
    for number, run in runs.items():  # each run spans its trial, not the moment it was logged
        trial = study.trials[number]
        assert (run.info.start_time, run.info.end_time) == (
            _ms(trial, "datetime_start"),
            _ms(trial, "datetime_complete"),
        )


def _keep_all_and_a_confirmed_pick() -> tuple[tuple[TrialRecord, ...], CandidateResult]:
    """Two trials (keep-all; 1.5x at KL 0.1) and the confirmation's candidate for the second."""
    records = (
        hand_record(0, 1.0, 0.0, (0.0, 0.0, 0.0, 0.0)),
        hand_record(1, 1.5, 0.1, (0.0, 30.0, 0.0, 0.0)),
    )
    est = Estimate(value=0.5, se=1.0, low=-1.0, high=2.0, upper=1.5, level=0.9, n=13)
    return records, CandidateResult(1, (0.0, 30.0, 0.0, 0.0), 1.5, 0.1, "confirmed", est, "why")


def test_the_recommendation_says_in_mlflow_and_its_file_whether_it_is_certified_at_the_confidence(
    tmp_path: Path,
) -> None:
    """Chosen on the calibration's 60% bound (10 points per nat: 1.0 at KL 0.1), the recommendation is
    reported at --confidence 90% too (25 points per nat: 2.5 > the 2-point budget)."""
    settings, study, uri = _toy(tmp_path)
    tracker = Tracker(uri, settings, study, Budget.from_settings(settings))
    records, rec = _keep_all_and_a_confirmed_pick()
    for at_90, certified in ((25.0, False), (15.0, True)):
        cal = Calibration(4.0, 10.0, 0.6, 13, (1,), 0.1, ((1, 0.1, 0.4),), 0.9, at_90)
        conf = Confirmation(2.0, 0.9, (rec,), 13, 2, "pooled", cal)
        outcome = StudyOutcome(
            "toy",
            StudyIdentity.from_dict(settings.study_identity()),
            Budget(FidelityLoss(0.6), ScoreLoss(2.0)),
            records,
            conf,
        )
        meta = outcome.schedule_of(records[1]).metadata["confirmation"]
        assert meta["predicted_task_loss_upper"] == pytest.approx(at_90 * 0.1) and meta["level"] == 0.9
        assert meta["certified_at_level"] is certified and meta["decision_level"] == 0.6
        assert "predicted_task_loss_upper" not in outcome.schedule_of(records[0]).metadata  # not the pick
    tracker.end_study(outcome, files=[])
    metrics = tracker.client.get_run(tracker.parent_id).data.metrics
    assert metrics["recommended.trial"] == 1 and metrics["recommended.certified_at_confidence"] == 1.0
    assert metrics["recommended.predicted_task_loss_upper"] == pytest.approx(1.5)


def test_the_fresh_drift_check_is_logged_and_exported_with_the_pick(tmp_path: Path) -> None:
    """The pick's KL on the fresh prompts is a metric, the prompts a tag, both in the exported
    schedule; the bound at --confidence is read at the larger KL, as the rule judged it."""
    import dataclasses

    from tuner.stages.confirm import FreshCheck

    settings, study, uri = _toy(tmp_path)
    tracker = Tracker(uri, settings, study, Budget.from_settings(settings))
    records, rec = _keep_all_and_a_confirmed_pick()
    cal = Calibration(4.0, 10.0, 0.6, 13, (1,), 0.1, ((1, 0.1, 0.4),), 0.9, 15.0)
    fresh = FreshCheck("open-QA validation (12 per dataset, 1024 tokens)", 24, ((1, 0.12),))
    conf = dataclasses.replace(Confirmation(2.0, 0.9, (rec,), 13, 2, "pooled", cal), fresh=fresh)
    assert Confirmation.from_dict(conf.to_dict()) == conf
    outcome = StudyOutcome(
        "toy", StudyIdentity.from_dict(settings.study_identity()), Budget(FidelityLoss(0.6), ScoreLoss(2.0)),
        records, conf,
    )  # fmt: skip
    meta = outcome.schedule_of(records[1]).metadata["confirmation"]
    assert meta["fresh"] == {"prompts": fresh.prompts, "n_examples": 24, "kl": 0.12}
    assert meta["predicted_task_loss_upper"] == pytest.approx(15.0 * 0.12)  # not 15 x 0.1
    tracker.end_study(outcome, files=[])
    run = tracker.client.get_run(tracker.parent_id)
    assert run.data.metrics["recommended.fresh_kl"] == pytest.approx(0.12)
    assert run.data.tags["lazyllm.fresh_check"] == fresh.prompts


def test_the_slope_prior_and_its_floor_are_logged_to_the_parent_run(tmp_path: Path) -> None:
    """The prior the study read is named (tag), attached (artifact ``slope_prior/``) and its floor's
    numbers are metrics; the exported schedule carries the floor too."""
    import dataclasses

    from tuner.statistics.prior import SlopePrior

    prior = SlopePrior(
        "toy", "openqa", 1024, 300, ("a",), 12.0, ((0.5, 12.0), (0.6, 13.0), (0.9, 16.0)),
        "rows.jsonl", "ef" * 32, "2026-12-02",
    )  # fmt: skip
    path = prior.save(tmp_path / "prior.json")
    settings, study, uri = _toy(tmp_path)
    settings = dataclasses.replace(
        settings, slope_prior=str(path), calibration_exponent=1.0
    )  # the toy prior is straight
    tracker = Tracker(uri, settings, study, Budget.from_settings(settings))
    records, rec = _keep_all_and_a_confirmed_pick()
    cal = Calibration(-6.0, -1.5, 0.6, 13, (1,), 0.1, ((1, 0.1, -0.6),), 0.9, -0.5).floored(prior, 2.0)
    outcome = StudyOutcome(
        "toy", StudyIdentity.from_dict(settings.study_identity()), Budget(FidelityLoss(0.6), ScoreLoss(2.0)),
        records, Confirmation(2.0, 0.9, (rec,), 13, 2, "pooled", cal),
    )  # fmt: skip
    assert outcome.schedule_of(records[1]).metadata["confirmation"]["slope_floor"]["prior"] == prior.id
    tracker.end_study(outcome, files=[])
    run = tracker.client.get_run(tracker.parent_id)
    assert run.data.tags["lazyllm.slope_prior"] == prior.id
    m = run.data.metrics
    assert (m["calibration.floor_applied"], m["calibration.floor_binds"]) == (1.0, 1.0)
    assert (m["calibration.prior_slope_upper"], m["calibration.own_slope_upper"]) == (13.0, -1.5)
    logged = [f.path for f in tracker.client.list_artifacts(tracker.parent_id, "slope_prior")]
    assert logged == ["slope_prior/toy.json"]
    local = tracker.client.download_artifacts(tracker.parent_id, "slope_prior/toy.json", str(tmp_path / "dl"))
    assert SlopePrior.load(local) == prior
    # a study without a prior says so
    settings2, study2, uri2 = _toy(tmp_path / "none")
    none = Tracker(uri2, settings2, study2, Budget.from_settings(settings2))
    none.end_study(StudyOutcome.from_study(study2), files=[])
    assert none.client.get_run(none.parent_id).data.tags["lazyllm.slope_prior"] == "none"


def test_passwords_never_reach_mlflow_or_study_attrs(tmp_path: Path) -> None:
    secret = "hunter2-secret"
    settings, study, uri = _toy(tmp_path, storage=f"postgresql+psycopg://lazyllm:{secret}@127.0.0.1:1/db")
    tracker = Tracker(uri, settings, study, Budget.from_settings(settings))
    study.optimize(lambda t: (1.0, 0.0), n_trials=1, callbacks=[tracker.callback])
    assert tracker.end_study(StudyOutcome.from_study(study), files=[], stopped="timeout") == "FINISHED"
    runs = [tracker.client.get_run(tracker.parent_id), *tracker.child_runs()]
    for run in runs:
        for value in [*run.data.params.values(), *run.data.tags.values()]:
            assert secret not in value
    assert runs[0].data.params["storage"] == "postgresql+psycopg://lazyllm:***@127.0.0.1:1/db"
    assert secret not in json.dumps(study.user_attrs)
    # every stage ran: FINISHED, with why the trials stopped (KILLED is for Ctrl-C and signals)
    assert runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["lazyllm.end_reason"] == "timeout: 1 of 3 trials"


def test_unreachable_tracking_server_fails_fast(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    with audited("socket.connect") as connects:
        assert main(_argv(tiny_folder, tmp_path, f"http://127.0.0.1:{port}", 1)) == 2
    # fast = one connection attempt, no retry loop (MLflow's client would retry for minutes)
    assert [args[1] for args in connects] == [("127.0.0.1", port)]
    assert "is not reachable" in capsys.readouterr().err
    assert not (tmp_path / "tracked" / "study.db").exists()  # nothing ran


def test_two_local_workers_share_one_study(tiny_folder: Path, tmp_path: Path) -> None:
    """Two processes on one study with the default SQLite storage and MLflow store: no lock errors,
    one parent run, one child per finished trial."""
    n = n_warm_starts()  # every queued warm start runs: no trial is left waiting
    argv = _argv(tiny_folder, tmp_path, "", n)
    argv = argv[: argv.index("--tracking-uri")]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tuner.search", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:]
        assert "database is locked" not in out
    study = optuna.load_study(study_name="tracked", storage=f"sqlite:///{tmp_path / 'tracked' / 'study.db'}")
    trials = study.get_trials()
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == n  # exactly the count asked for, though two workers raced for the last slots
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert all(never_ran(t) for t in failed)  # only surplus or refused trials may fail, never evaluated
    assert len(finished) + len(failed) == len(trials)
    assert_evaluated_once([t for t in finished if t.state == TrialState.COMPLETE])
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'tracked' / 'mlflow.db'}")
    parents, children = _runs(client)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    # one child per trial that ran; surplus trials never ran and get none
    assert sorted(int(c.data.tags["optuna.trial"]) for c in children) == sorted(t.number for t in finished)


def test_a_trial_stopped_early_by_design_is_finished_not_killed(tmp_path: Path) -> None:
    """KILLED reads as "it crashed or someone stopped it": a trial the early-stop rule pruned ends
    FINISHED, its state in a tag; KILLED is left for Ctrl-C and signals."""
    settings, study, uri = _toy(tmp_path)
    tracker = Tracker(uri, settings, study, Budget.from_settings(settings))

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        raise optuna.TrialPruned("over budget after 2 examples")

    study.optimize(objective, n_trials=1, callbacks=[tracker.callback])
    (run,) = tracker.child_runs()
    assert run.info.status == "FINISHED" and run.data.tags["optuna.state"] == "PRUNED"
