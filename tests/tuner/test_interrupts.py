"""Ctrl-C at any moment of ``python -m tuner.search`` leaves a study the same command resumes.

One study, five real subprocesses: a real SIGINT during the MLflow store creation, during the
baseline, in the middle of a trial and during the export, then a rerun to completion. The checks:
a one-line hint and exit 130 each time (no traceback), no half-made store, the interrupted trial
retried with the same parameters, and at the end the exact trial count, no schedule evaluated twice,
every warm-start schedule evaluated, one MLflow child run per finished or failed trial, the parent
FINISHED.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from lazyllm.schedule import Schedule
from tests.support import assert_evaluated_once, longbench_dir, n_warm_starts
from tuner.search import RESUME_HINT
from tuner.study.spaces import load_space
from tuner.study.workers import never_ran

ROOT = Path(__file__).resolve().parents[2]
STUDY = "interrupts"
Moment = Callable[[str, Path], bool]
# the unpruned answers are computed and saved 8 at a time (decoded together): up to 3 validation
# examples per QA dataset (11 of LongBench's 13) leave a chunk still to do when the first is saved
PER_DATASET = 3


def _n_examples() -> int:
    from tuner.data.longbench import split_records
    from tuner.data.sources import resolve_source

    task = resolve_source(longbench_dir()).load_task("qa", "en")
    return sum(min(PER_DATASET, len(split_records(rs, "validation"))) for rs in task.values())


def _argv(model: Path, out: Path) -> list[str]:
    return [
        "--model", str(model), "--data-dir", longbench_dir(), "--output", str(out), "--study-name", STUDY,
        "--n-trials", str(n_warm_starts()), "--n-examples", str(PER_DATASET), "--max-prompt-tokens", "128", "--max-new-tokens", "2",
        "--speedup", "flops", "--no-heldout", "--sampler", "random",
        "--max-kl", "0.6",  # the constant cap: no pilot caches the baseline before the moments below
    ]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", LONGBENCH_DIR=longbench_dir())
    return env


def _run(
    argv: list[str], cwd: Path, moment: Moment | None, study_dir: Path, limit_s: float = 600.0
) -> tuple[int, str]:
    """Run the search; send SIGINT as soon as ``moment(output so far, study folder)`` holds.

    ``limit_s`` is a hang guard, not a speed check: a run takes well under a minute on an idle
    2-core machine and several on a loaded one; only a search that never ends reaches it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner.search", *argv],
        cwd=cwd,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    chunks: list[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 65536):
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + limit_s
    try:
        while moment is not None and proc.poll() is None:
            if moment(b"".join(chunks).decode(errors="replace"), study_dir):
                proc.send_signal(signal.SIGINT)
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"the moment never came:\n{b''.join(chunks).decode()[-3000:]}")
            time.sleep(0.01)
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    return rc, b"".join(chunks).decode(errors="replace")


def _interrupted(rc: int, output: str) -> None:
    assert rc == 130, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert output.rstrip().endswith(RESUME_HINT)


def _study(study_dir: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_dir / 'study.db'}")


def _cache_entries(study_dir: Path) -> int:
    files = list((study_dir / "cache").glob("baseline-*.json"))
    return sum(len(json.loads(f.read_text())["entries"]) for f in files)


def _in_baseline(output: str, study_dir: Path) -> bool:
    return (study_dir / "cache").is_dir() and any((study_dir / "cache").glob("baseline-*.json"))


def test_interrupt_at_every_moment_then_resume(tiny_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    study_dir = out / STUDY
    argv = _argv(tiny_folder, out)

    # 1. while MLflow creates its store (several seconds of schema migrations)
    rc, output = _run(argv, tmp_path, lambda o, d: "Creating initial MLflow database tables" in o, study_dir)
    _interrupted(rc, output)
    assert not (study_dir / "mlflow.db").exists()  # never half-made: it appears complete or not at all
    assert not list(study_dir.glob("*.creating-*"))

    # 2. during the baseline: the cache is saved per chunk, the rerun goes on from there
    rc, output = _run(argv, tmp_path, _in_baseline, study_dir)
    _interrupted(rc, output)
    assert (study_dir / "mlflow.db").exists()
    assert 1 <= _cache_entries(study_dir) < _n_examples() > 8  # the first chunk of 8 saved
    assert not [t for t in _study(study_dir).get_trials() if t.state != TrialState.WAITING]

    # 3. in the middle of a trial: FAILED with user attr `interrupted`, a copy queued with its params
    rc, output = _run(argv, tmp_path, lambda o, d: "trial 0:" in o, study_dir)
    _interrupted(rc, output)
    assert _cache_entries(study_dir) == _n_examples()
    trials = _study(study_dir).get_trials()
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 1 and failed[0].user_attrs.get("interrupted") is True
    copies = [
        t
        for t in trials
        if t.state == TrialState.WAITING and t.system_attrs.get("failed_trial") == failed[0].number
    ]
    assert len(copies) == 1 and copies[0].params == failed[0].params

    # 4. during the export (after the last trial): rerun rewrites it
    rc, output = _run(argv, tmp_path, lambda o, d: (d / "pareto").is_dir(), study_dir)
    _interrupted(rc, output)
    assert "Pareto front" not in output

    # 5. the same command, to the end
    rc, output = _run(argv, tmp_path, None, study_dir)
    assert rc == 0, output[-3000:]
    study = _study(study_dir)
    trials = study.get_trials()
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    failed = [t for t in failed if not never_ran(t)]  # refused duplicates never ran
    assert len(finished) == n_warm_starts() and [t.user_attrs.get("interrupted") for t in failed] == [True]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # no schedule evaluated twice (a repeated proposal is refused before it runs)
    assert_evaluated_once(finished)
    # every warm start (keep-all's reference, paper-style, one stage at mid depth, paper-style from a
    # quarter of depth, the two peers at their published share, the one-stage family) evaluated, the
    # interrupted one included
    done = [t.params for t in finished]
    for params in load_space("stages").warm_start(4):
        assert params in done
    assert failed[0].params in done
    # the export is whole again
    front = json.loads((study_dir / "pareto.json").read_text())
    assert front and all((study_dir / row["file"]).is_file() for row in front)
    Schedule.load(study_dir / "recommended.json")
    assert not list(study_dir.glob("*.creating-*"))

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{study_dir / 'mlflow.db'}")
    parent_id = study.user_attrs["mlflow_parent_run_id"]
    children = client.search_runs(
        [client.get_run(parent_id).info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'",
    )
    logged = sorted(int(r.data.tags["optuna.trial"]) for r in children)
    assert logged == sorted(t.number for t in [*finished, *failed])
    by_number = {int(r.data.tags["optuna.trial"]): r for r in children}
    assert by_number[failed[0].number].info.status == "FAILED"
    assert client.get_run(parent_id).info.status == "FINISHED"  # needs issue-14 tracking lifecycle


def test_half_made_mlflow_store_from_an_older_run_is_repaired(tmp_path: Path) -> None:
    """A store an older version left half-migrated (``_alembic_tmp_*``, no runs) is moved aside and made again."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    from tuner.study.storage import prepare_mlflow_store

    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE experiments (experiment_id INTEGER)")
        con.execute("CREATE TABLE _alembic_tmp_trace_info (x INTEGER)")
    prepare_mlflow_store(f"sqlite:///{db}")
    assert (tmp_path / "mlflow.db.broken").exists()
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    assert client.create_experiment("e")  # a working store
    prepare_mlflow_store(f"sqlite:///{db}")  # a good store is left alone
    assert client.get_experiment_by_name("e") is not None


# a real SIGINT, sent by the child to itself when it starts importing torch: deterministic, whatever
# the machine's speed; then the command module runs as the program, as ``python -m`` runs it
_WHILE_IMPORTING = """
import importlib.abc, os, runpy, signal, sys
class Press(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Press())
sys.argv = [sys.argv[1], "--help"]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_while_a_command_imports_torch_is_one_line_and_exit_130() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for module in ("tuner.search", "tuner.evaluate", "tuner.export"):
        done = subprocess.run(
            [sys.executable, "-c", _WHILE_IMPORTING, module],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 130, (module, done.returncode, done.stderr[-2000:])
        assert done.stderr.strip() == "interrupted while starting: nothing was done", done.stderr[-2000:]
        assert done.stdout == ""  # it never got as far as the help


_IN_A_FINALIZER = r"""
import sys, time
from tuner.interrupts import interrupts_end_the_start

with interrupts_end_the_start("__main__"):  # what every tuner command does first
    pass


class Finalized:
    def __del__(self) -> None:  # as SQLAlchemy's weakref callbacks run during a garbage collection
        print("in a finalizer", flush=True)
        end = time.monotonic() + 5
        while time.monotonic() < end:
            time.sleep(0.01)


try:
    Finalized()  # dropped at once: its finalizer runs here, and the Ctrl-C lands in it
    time.sleep(5)  # the command going on
    print("ran to its end", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def test_a_ctrl_c_that_lands_in_a_finalizer_still_interrupts_the_command() -> None:
    """Python prints and drops a KeyboardInterrupt raised inside a ``__del__`` or weakref callback:
    the PostgreSQL Ctrl-C test once saw the command run on to exit 0 after a SIGINT landed in
    SQLAlchemy's cleanup. A real SIGINT is sent while a real finalizer runs; the command must still
    end interrupted, soon after the finalizer."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _IN_A_FINALIZER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "in a finalizer"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "ran to its end" not in out, (out, err[-2000:])
    assert proc.returncode == 130 and out.strip() == "interrupted", (proc.returncode, out, err[-2000:])
    assert "Exception ignored" not in err, err[-2000:]  # the dropped interrupt is not reported as an error
