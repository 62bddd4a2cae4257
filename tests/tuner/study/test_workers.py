"""tuner.study.workers.run_trials on a real SQLite study: exact counts, surplus trials, failure streaks, timeout."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from tuner.study.storage import make_storage
from tuner.study.workers import MAX_CONSECUTIVE_FAILURES, SurplusTrial, counts, is_surplus, run_trials


def _study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(
        storage=f"sqlite:///{tmp_path / 'study.db'}", directions=["maximize", "minimize"], study_name="w"
    )


def _settings(n_trials: int, timeout: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(n_trials=n_trials, trials_timeout=timeout, heartbeat_grace=2)


def test_runs_exactly_n_finished_trials_and_resumes(tmp_path: Path) -> None:
    study = _study(tmp_path)
    seen: list[int] = []

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        seen.append(trial.number)
        x = trial.suggest_float("x", 0, 1)
        if trial.number == 1:
            raise optuna.TrialPruned("pruned trials count as finished")
        return x, 1 - x

    assert run_trials(_settings(4), study, objective, []) == "done"  # type: ignore[arg-type]
    c = counts(study)
    assert c[TrialState.COMPLETE] + c[TrialState.PRUNED] == 4 and c[TrialState.PRUNED] == 1
    assert seen == [0, 1, 2, 3]
    # a rerun with a larger count adds only the missing trials; the same count adds none
    assert run_trials(_settings(6), study, objective, []) == "done"  # type: ignore[arg-type]
    assert run_trials(_settings(6), study, objective, []) == "done"  # type: ignore[arg-type]
    assert seen == [0, 1, 2, 3, 4, 5] and len(study.trials) == 6


def test_failed_trials_do_not_count_and_a_failure_streak_stops(tmp_path: Path) -> None:
    study = _study(tmp_path)
    calls = {"n": 0}

    def flaky(trial: optuna.Trial) -> tuple[float, float]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("one bad trial")
        return 1.0, 0.0

    assert run_trials(_settings(3), study, flaky, []) == "done"  # type: ignore[arg-type]
    c = counts(study)
    assert (c[TrialState.COMPLETE], c[TrialState.FAIL]) == (3, 1)

    def broken(trial: optuna.Trial) -> tuple[float, float]:
        raise RuntimeError("always")

    with pytest.raises(ValueError, match=f"{MAX_CONSECUTIVE_FAILURES} trials in a row failed"):
        run_trials(_settings(5), study, broken, [])  # type: ignore[arg-type]
    assert counts(study)[TrialState.FAIL] == 1 + MAX_CONSECUTIVE_FAILURES


def test_surplus_rule(tmp_path: Path) -> None:
    study = _study(tmp_path)
    for _ in range(2):
        study.enqueue_trial({})
    # two live (waiting) trials numbered 0 and 1: with a target of 2, trial 2 is surplus, 1 is not
    assert not is_surplus(study, 1, 2) and is_surplus(study, 2, 2)

    calls = {"n": 0}

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        calls["n"] += 1
        if calls["n"] <= MAX_CONSECUTIVE_FAILURES + 1:  # as TrialRunner does for a trial one too many
            trial.set_user_attr("surplus", True)
            raise SurplusTrial("one too many")
        return 1.0, 0.0

    # surplus trials are FAILED and never evaluated, and they do not count towards the failure streak
    assert run_trials(_settings(2), study, objective, []) == "done"  # type: ignore[arg-type]
    c = counts(study)
    assert (c[TrialState.COMPLETE], c[TrialState.FAIL]) == (2, MAX_CONSECUTIVE_FAILURES + 1)


def test_timeout_stops_between_trials(tmp_path: Path) -> None:
    study = _study(tmp_path)

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        return 1.0, 0.0

    assert run_trials(_settings(100, timeout=1e-9), study, objective, []) == "timeout"  # type: ignore[arg-type]
    assert len(study.trials) <= 1


def test_a_trial_whose_worker_died_before_its_first_heartbeat_is_retried(tmp_path: Path) -> None:
    """Defect (CI, the chaos test): a SIGKILL between Optuna creating a trial and its heartbeat thread's
    first beat left a RUNNING trial with no heartbeat; Optuna's stale check skips those, so every
    later run waited for it forever."""
    storage = make_storage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=1, grace=2)
    study = optuna.create_study(storage=storage, directions=["maximize", "minimize"], study_name="w")
    study.enqueue_trial({"x": 0.25})
    with pytest.warns(UserWarning, match="Heartbeat of storage is supposed to be used with Study.optimize"):
        orphan = study.ask()  # RUNNING with no heartbeat row: exactly what the killed worker left
    assert orphan.number == 0 and study.trials[0].state == TrialState.RUNNING
    ran: list[float] = []

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        ran.append(trial.suggest_float("x", 0, 1))
        return ran[-1], 0.0

    # "done", not "timeout": the orphan was failed once its heartbeat went stale, not waited out (a
    # worker that waited for it would stop at --timeout, 30 s, and say so)
    assert run_trials(_settings(1, timeout=30), study, objective, [], poll_s=0.2) == "done"  # type: ignore[arg-type]
    trials = study.get_trials()
    assert trials[0].state == TrialState.FAIL  # the orphan, failed once its heartbeat went stale
    assert [t.state for t in trials[1:]] == [TrialState.COMPLETE] and ran == [0.25]  # its queued retry


def test_queued_trials_are_not_taken_while_running_trials_hold_the_last_slots(tmp_path: Path) -> None:
    """Issue 32: with --n-workers 2, a worker whose peer held the last slot took every queued warm
    start past n_trials and failed it as surplus ("[trial 3/4] #N fail" lines, nothing failed)."""
    import threading

    study = _study(tmp_path)
    held = study.ask()  # another worker's trial, holding the last slot
    study.tell(study.ask(), (1.0, 0.0))
    for _ in range(3):
        study.enqueue_trial({})  # warm starts past n_trials = 2
    taken: list[int] = []

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        taken.append(trial.number)
        if is_surplus(trial.study, trial.number, 2):  # as TrialRunner.check_slot does
            trial.set_user_attr("surplus", True)
            raise SurplusTrial("one too many")
        return 1.0, 0.0

    peer = threading.Timer(1.0, lambda: study.tell(held, (2.0, 0.0)))  # the peer finishes its trial
    peer.start()
    try:
        assert run_trials(_settings(2), study, objective, [], poll_s=0.1) == "done"  # type: ignore[arg-type]
    finally:
        peer.join()
    c = counts(study)
    assert taken == [] and (c[TrialState.COMPLETE], c[TrialState.FAIL], c[TrialState.WAITING]) == (2, 0, 3)


def test_an_error_raised_while_a_ctrl_c_was_handled_is_an_interrupt() -> None:
    """A SIGINT inside Optuna's tell surfaced as its UnboundLocalError (exit 1 in the chaos test):
    with the KeyboardInterrupt as its context it is an interrupt, and nothing else is."""
    from tuner.study.workers import interrupted_by_ctrl_c

    def raised_while_handling() -> BaseException:
        try:
            try:
                raise KeyboardInterrupt
            finally:
                raise UnboundLocalError("cannot access local variable 'updated_state'")
        except UnboundLocalError as exc:
            return exc

    assert interrupted_by_ctrl_c(KeyboardInterrupt())
    assert interrupted_by_ctrl_c(raised_while_handling())
    assert not interrupted_by_ctrl_c(UnboundLocalError("a bug of ours"))
    try:
        try:
            raise ValueError("bad input")
        finally:
            pass
    except ValueError as plain:
        assert not interrupted_by_ctrl_c(plain)


def _heartbeats() -> list[threading.Thread]:
    from optuna.storages._heartbeat import HeartbeatThread

    beat = HeartbeatThread._record_heartbeat
    return [t for t in threading.enumerate() if getattr(t, "_target", None) is beat]


def test_a_ctrl_c_in_optunas_heartbeat_setup_leaves_no_thread_beating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C landing after Optuna started a trial's heartbeat thread but before its ``with`` body
    skips the block's exit, so nothing stops the (non-daemon) thread and the CLI hung after its
    Ctrl-C line (chaos test). The interrupt is delivered at that moment here: once it reaches the
    caller, no heartbeat thread may still be beating."""
    from optuna.storages._heartbeat import HeartbeatThread

    storage = make_storage(f"sqlite:///{tmp_path / 'study.db'}", heartbeat_interval=1, grace=2)
    study = optuna.create_study(storage=storage, directions=["maximize", "minimize"], study_name="w")
    started: list[threading.Thread] = []

    def enter_then_ctrl_c(self: HeartbeatThread) -> None:
        self.start()
        started.extend(t for t in _heartbeats() if t.is_alive())
        raise KeyboardInterrupt  # the signal, between the thread's start and the block's body

    monkeypatch.setattr(HeartbeatThread, "__enter__", enter_then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_trials(_settings(1), study, lambda trial: (1.0, 0.0), [], poll_s=0.01)  # type: ignore[arg-type]
        assert started, "no heartbeat thread was started: the moment under test never came"
        for thread in started:
            thread.join(timeout=5)
        assert not [t for t in started if t.is_alive()], "a heartbeat thread is still beating"
    finally:  # a red run must not leave the thread holding pytest's exit
        for thread in started:
            for arg in getattr(thread, "_args", ()):
                if isinstance(arg, threading.Event):
                    arg.set()
