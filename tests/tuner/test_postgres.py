"""Many workers on one study in a real PostgreSQL: counts, a killed worker, Ctrl-C and resume, a shared pilot.

CI starts PostgreSQL (see .ci/run) and these tests must run there; elsewhere they skip with the
reason when no server answers at $LAZYLLM_TEST_POSTGRES.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import FrozenTrial, TrialState

from tests.support import assert_evaluated_once, longbench_dir, n_warm_starts
from tuner.search import main
from tuner.stages.pilot import PILOT_ATTR
from tuner.statistics.cap import pilot_cap
from tuner.study.settings import SearchSettings
from tuner.tracking.runs import EXPERIMENT

BASE = os.environ.get("LAZYLLM_TEST_POSTGRES", "postgresql+psycopg://lazyllm:lazyllm@127.0.0.1:5432/postgres")


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A throwaway database, dropped afterwards."""
    if os.environ.get("CI"):  # .ci/run sets it: there a missing driver fails, never skips
        import psycopg
    else:
        psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(_plain(BASE), autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must provide PostgreSQL at {BASE}: {exc}")
        pytest.skip(f"no PostgreSQL server at {BASE} ({str(exc).splitlines()[0]}); .ci/run starts one")
    name = f"lazyllm_test_{uuid.uuid4().hex[:10]}"
    admin.execute(f"CREATE DATABASE {name}")
    try:
        yield BASE.rsplit("/", 1)[0] + "/" + name
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


def _argv(folder: Path, out: Path, storage: str, n: int, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", "qa,trec", "--n-examples", "2", "--max-prompt-tokens", "256",
        "--max-new-tokens", "8", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "pg",
        "--sampler", "random", "--n-trials", str(n), "--no-heldout", "--storage", storage, *extra,
    ]  # fmt: skip


def _fast_heartbeat(tmp_path: Path) -> str:
    preset = tmp_path / "fast.yaml"
    preset.write_text("heartbeat_interval: 1\nheartbeat_grace: 4\n")
    return str(preset)


@contextmanager
def _storage(url: str) -> Iterator[optuna.storages.RDBStorage]:
    """One storage whose connections go back to the server when done: polling with a new storage
    each time leaks pooled connections until garbage collection and can exhaust the server's slots."""
    storage = optuna.storages.RDBStorage(url)
    try:
        yield storage
    finally:
        storage.engine.dispose()


def _trials(url: str) -> list[FrozenTrial]:
    with _storage(url) as storage:
        return optuna.load_study(study_name="pg", storage=storage).get_trials()


def _states(storage: optuna.storages.RDBStorage) -> dict[TrialState, int]:
    study = optuna.load_study(study_name="pg", storage=storage)
    out = dict.fromkeys(TrialState, 0)
    for t in study.get_trials():
        out[t.state] += 1
    return out


def _heartbeats(url: str) -> int:
    import psycopg

    with psycopg.connect(_plain(url), connect_timeout=3) as conn:
        row = conn.execute(
            "SELECT count(*) FROM trial_heartbeats h JOIN trials t ON t.trial_id = h.trial_id "
            "WHERE t.state = 'RUNNING'"
        ).fetchone()
    return int(row[0]) if row else 0


def _other_connections(url: str) -> int:
    """Connections to this test's database other than the one asking."""
    import psycopg

    with psycopg.connect(_plain(url), connect_timeout=3) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.search", *argv],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_for(url: str, pred: Callable[[dict[TrialState, int]], bool], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    with _storage(url) as storage:
        while time.monotonic() < deadline:
            try:
                if pred(_states(storage)):
                    return
            except KeyError:  # the study does not exist yet
                pass
            time.sleep(0.1)
    raise AssertionError("timed out waiting for the study")


def _kill_mid_trial(victim: subprocess.Popen[bytes], url: str, timeout: float = 180) -> list[int]:
    """SIGKILL ``victim`` while one of its trials runs with its heartbeat on record (Optuna cannot tell
    a trial killed in the first milliseconds, before its first heartbeat, from a live one: a documented
    limitation); the numbers of the trials it left running.

    A tiny trial can finish between the poll that sees it running and the kill, so the worker is
    first frozen (SIGSTOP: it changes nothing while stopped), the storage read again, and the kill sent
    only if a trial is still running with a heartbeat; otherwise it goes on (SIGCONT) and we wait again.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _wait_for(
            url, lambda c: c[TrialState.RUNNING] >= 1 and _heartbeats(url) >= 1, deadline - time.monotonic()
        )
        victim.send_signal(signal.SIGSTOP)
        time.sleep(0.5)  # a statement the worker sent before it stopped lands on the server
        running = [t.number for t in _trials(url) if t.state == TrialState.RUNNING]
        if running and _heartbeats(url) >= 1:
            victim.send_signal(signal.SIGKILL)  # kill -9, mid-trial
            return running
        victim.send_signal(signal.SIGCONT)
    raise AssertionError("timed out waiting to kill the worker mid-trial")


def test_three_workers_share_the_warm_starts(tiny_folder: Path, tmp_path: Path, pg_url: str) -> None:
    n = n_warm_starts()  # every queued warm start runs: no trial is left waiting
    assert main(_argv(tiny_folder, tmp_path, pg_url, n, "--n-workers", "3")) == 0
    assert _other_connections(pg_url) == 0  # the search and its workers gave their connections back
    trials = _trials(pg_url)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == n  # some may stop early (dominated by a faster warm start): they ran too
    assert_evaluated_once(finished)
    others = [t for t in trials if t not in finished]
    assert all(t.state == TrialState.FAIL and t.user_attrs.get("surplus") for t in others)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'pg' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(EXPERIMENT)
    assert exp is not None
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("lazyllm.role") == "study"]
    children = [r for r in runs if r.data.tags.get("lazyllm.role") == "trial"]
    assert len(parents) == 1 and len(children) == n
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parents[0].info.run_id}


def test_killed_worker_trial_is_retried(tiny_folder: Path, tmp_path: Path, pg_url: str) -> None:
    argv = _argv(
        tiny_folder,
        tmp_path,
        pg_url,
        n_warm_starts(),
        "--preset",
        _fast_heartbeat(tmp_path),
        "--tracking-uri",
        "none",
    )
    victim = _spawn(argv, tmp_path / "victim.log")
    try:
        killed = _kill_mid_trial(victim, pg_url)
    finally:
        victim.kill()
        victim.wait(timeout=30)
    assert len(killed) == 1
    survivors = [_spawn(argv, tmp_path / f"survivor{i}.log") for i in range(2)]
    for i, p in enumerate(survivors):
        assert p.wait(timeout=300) == 0, (tmp_path / f"survivor{i}.log").read_text()[-3000:]
    trials = _trials(pg_url)
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == n_warm_starts()  # every warm start, the killed one's retry among them
    assert trials[killed[0]].state == TrialState.FAIL  # its heartbeat went stale
    retried = [t for t in finished if t.system_attrs.get("failed_trial") == killed[0]]
    assert len(retried) == 1
    dead = trials[killed[0]]
    # the kill may land between two of its suggestions: whatever it had drawn, the retry draws alike
    assert dead.params.items() <= retried[0].params.items(), (dead.params, retried[0].params)
    # a queued (warm start) trial is retried with all of its queued parameters
    fixed = dead.system_attrs.get("fixed_params")
    if fixed:
        assert retried[0].params == fixed


def test_ctrl_c_then_rerun_resumes(tiny_folder: Path, tmp_path: Path, pg_url: str) -> None:
    argv = _argv(tiny_folder, tmp_path, pg_url, 4, "--tracking-uri", "none")
    proc = _spawn(argv, tmp_path / "run.log")
    _wait_for(pg_url, lambda c: c[TrialState.COMPLETE] >= 1 and c[TrialState.RUNNING] >= 1)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert "rerun the same command to resume" in (tmp_path / "run.log").read_text()
    before = _trials(pg_url)
    done_before = {t.number: t.params for t in before if t.state == TrialState.COMPLETE}
    assert done_before and not [t for t in before if t.state == TrialState.RUNNING]  # storage consistent
    assert main(argv) == 0
    after = _trials(pg_url)
    assert len([t for t in after if t.state == TrialState.COMPLETE]) == 4
    assert {n: after[n].params for n in done_before} == done_before  # nothing redone


def test_two_worker_processes_read_the_pilot_their_study_stored(
    tiny_folder: Path, tmp_path: Path, pg_url: str
) -> None:
    # the tiny model has no packaged prior: the first worker runs the pilot and stores it with the study
    first = _spawn(_argv(tiny_folder, tmp_path, pg_url, 2, "--tracking-uri", "none"), tmp_path / "first.log")
    assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    assert "pilot on 11 validation examples" in (tmp_path / "first.log").read_text()
    # what a pilot on another machine might have measured: a slope no forward here gives, and the cap it
    # sets in the identity; a worker that measured the pilot again would find its own cap and be refused
    cap = pilot_cap(2.0, 7.5, SearchSettings().calibration_exponent)
    assert cap is not None
    with _storage(pg_url) as storage:
        study = optuna.load_study(study_name="pg", storage=storage)
        study.set_user_attr(PILOT_ATTR, {"slope": 7.5, "points": [["paper-style", 0.01, 0.5]], "n": 99})
        study.set_user_attr(
            "identity", study.user_attrs["identity"] | {"search_cap": cap.nats, "search_cap_source": "pilot"}
        )
    argv = _argv(tiny_folder, tmp_path, pg_url, 6, "--tracking-uri", "none")
    workers = [_spawn(argv, tmp_path / f"worker{i}.log") for i in range(2)]  # two processes at once
    for i, p in enumerate(workers):
        assert p.wait(timeout=300) == 0, (tmp_path / f"worker{i}.log").read_text()[-3000:]
    for i in range(2):
        log = (tmp_path / f"worker{i}.log").read_text()
        assert "pilot on 99 validation examples (paper-style: KL 0.0100 nats" in log, log[-3000:]
        assert "read from the study: measured when it was created" in log
    with _storage(pg_url) as storage:
        study = optuna.load_study(study_name="pg", storage=storage)
        identity = study.user_attrs["identity"]
        finished = [t for t in study.get_trials() if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert (identity["search_cap"], identity["search_cap_source"]) == (cap.nats, "pilot")
    assert len(finished) == 6


def test_unreachable_storage_is_a_clear_error(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "postgresql+psycopg://nobody:x@127.0.0.1:1/none"
    assert main(_argv(tiny_folder, tmp_path, url, 1, "--tracking-uri", "none")) == 2
    err = capsys.readouterr().err
    assert "cannot reach Optuna storage" in err and "nobody:***@127.0.0.1" in err and ":x@" not in err
