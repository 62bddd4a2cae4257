"""Chaos: a seeded loop of SIGINT and SIGKILL at random moments over one tiny study, then the same
command to the end, then the invariants (issue 21).

Every run is the same real ``python -m tuner.search`` command (tiny 4-layer checkpoint, one example
per dataset, one trial per warm start, confirmation and the held-out check on, default SQLite stores).
Each of the interrupted runs gets a signal after a seeded random delay, anywhere from interpreter
start to the end of the run: a seeded choice of a moment of the run (interpreter start, MLflow store
creation, the baseline and fidelity reference, a trial's scoring or its report line, confirmation's
task scoring, the held-out scoring, the summary's Pareto front and held-out check, the MLflow
wrap-up; recognised by its line of output, or the first later one a resumed run reaches) plus a seeded
random delay of up to a second, SIGKILL one time in three. An interrupted run may end with its
signal or with the CLI's Ctrl-C line, never with an error. A run that finished before its signal
tests nothing: each run's fate is printed, and at least ``MIN_INTERRUPTED`` of the ``INTERRUPTIONS``
must end by their signal (the seed is chosen so that they do). Heartbeats every second (grace 2 s)
let the next run fail a trial a SIGKILL left RUNNING. After the final run:

* the study holds exactly ``n_trials`` finished trials, nothing RUNNING or WAITING;
* no schedule was evaluated twice (:func:`tests.support.assert_evaluated_once`);
* the MLflow parent run is FINISHED;
* every JSON file in the study folder parses;
* ``recommended.json`` is absent or carries its confirmation (``metadata.confirmation``);
* no temporary store of a run killed while creating it is left (``*.creating-<pid>``);
* no temporary file of a write a SIGKILL cut short is left: before the final run a real writer of
  ``heldout.json`` is SIGKILLed mid-write (the final writes' own atomic writer), and an older
  version's pid-less temporary an hour old lies beside it; the final run removes both (issue 32).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from lazyllm.atomic import LEGACY_AGE_S
from tests.lazyllm.test_atomic import killed_mid_write
from tests.support import assert_evaluated_once, longbench_dir, n_warm_starts

ROOT = Path(__file__).resolve().parents[2]
STUDY = "chaos"
# its plan: 8 of the 10 moments, SIGKILL in store creation, baseline, a trial and the held-out scoring;
# chosen so that at most one signal is drawn later than 0.3 s after a moment of the summary (Pareto
# front, Held-out, MLflow), the only ones a fast machine may finish before its signal arrives
SEED = 142
MOMENT_WAIT_S = 300
"""The longest a run may take to reach its moment: a run that neither reaches it nor ends has hung."""
INTERRUPTIONS = 10
# at least this many of the seeded runs must end by their signal (130 or killed): a run that finished
# first tests nothing; 10 of 10 land on a busy 2-core machine, the margin is for a fast one
MIN_INTERRUPTED = 8
# the moments of a run, by the output line that starts them ("" = from interpreter start)
# (in the order of a run: the store, the baseline, the trials, confirmation's task scoring, the held-out
# scoring, then the summary printed from the finished outcome, then MLflow; every one of them must show
# in some run's output, so a renamed line cannot silently turn its moment into the next one)
MOMENTS = ("", "Creating initial MLflow", "baseline and reference", "trial ", "[trial ", "task score of",
           "test: ", "Pareto front", "Held-out", "MLflow: parent run")  # fmt: skip


def _argv(model: Path, out: Path) -> list[str]:
    return [
        "-m", "tuner.search", "--model", str(model), "--task", "hotpotqa", "--n-examples", "1",
        "--max-prompt-tokens", "256", "--max-new-tokens", "4", "--n-trials", str(n_warm_starts()), "--speedup", "flops",
        "--data-dir", longbench_dir(), "--output", str(out), "--study-name", STUDY, "--sampler", "random",
        "--heartbeat-interval", "1", "--heartbeat-grace", "2",
        "--max-kl", "0.6",  # the constant cap: no pilot (tests/tuner/stages/test_pilot.py), the moments as listed
    ]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", LONGBENCH_DIR=longbench_dir())
    return env


def _start(argv: list[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen(
            [sys.executable, *argv], cwd=cwd, env=_env(), stdout=fh, stderr=subprocess.STDOUT
        )


def _reached(output: str, moment: str) -> bool:
    """The run is at ``moment`` or past it: a resumed run skips stages (the store exists, the
    baseline is cached, the trials are done), so the first later moment it reaches stands in."""
    return any(m in output for m in MOMENTS[MOMENTS.index(moment) :])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def plan(seed: int) -> list[tuple[str, float, signal.Signals]]:
    """``INTERRUPTIONS`` seeded (moment, delay in s, signal), in the order of a run's moments: the
    study moves forward, so early interruptions hit early stages and later ones the stages every
    rerun goes through (export, confirmation, held-out check, MLflow)."""
    rng = random.Random(seed)
    chosen = sorted(rng.choices(range(len(MOMENTS)), k=INTERRUPTIONS))
    steps = []
    for index in chosen:
        delay = rng.uniform(0.2, 6.0) if MOMENTS[index] == "" else rng.uniform(0.0, 1.0)
        steps.append((MOMENTS[index], delay, signal.SIGKILL if rng.random() < 1 / 3 else signal.SIGINT))
    return steps


def test_seeded_signals_at_random_moments_then_rerun(tiny_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    study_dir = out / STUDY
    argv = _argv(tiny_folder, out)
    began = time.monotonic()
    interrupted, missed, seen = 0, 0, ""
    for i, (moment, delay, sig) in enumerate(plan(SEED)):
        log = tmp_path / f"run-{i}.log"
        proc = _start(argv, tmp_path, log)
        sent = False
        try:
            deadline = time.monotonic() + MOMENT_WAIT_S
            while proc.poll() is None and not _reached(log.read_text(errors="replace"), moment):
                assert time.monotonic() < deadline, (
                    f"run {i} reached neither {moment!r} nor its end in {MOMENT_WAIT_S} s"
                )
                time.sleep(0.05)
            time.sleep(delay)
            if proc.poll() is None:
                proc.send_signal(sig)
                sent = True
            rc = proc.wait(timeout=60)
        finally:
            _stop(proc)
        text = log.read_text(errors="replace")
        # its signal (-2, -9), the CLI's Ctrl-C line (130) or done (0); never an error (1, 2)
        assert rc in (0, 130, -signal.SIGINT, -signal.SIGKILL), (
            f"run {i} ({sig.name} at {moment!r}):\n{text[-3000:]}"
        )
        seen += text
        landed = sent and rc in ((-signal.SIGKILL,) if sig == signal.SIGKILL else (130, -signal.SIGINT))
        interrupted, missed = interrupted + landed, missed + (not landed)
        print(f"chaos run {i}: {sig.name} {delay:.2f} s after {moment!r}: exit {rc}, "
              f"{'interrupted' if landed else 'finished before its signal'}")  # fmt: skip
        assert missed <= INTERRUPTIONS - MIN_INTERRUPTED, (
            f"{missed} of {i + 1} runs finished before their signal (at most "
            f"{INTERRUPTIONS - MIN_INTERRUPTED} of {INTERRUPTIONS} may)"
        )
    print(f"chaos: {interrupted} of {INTERRUPTIONS} runs interrupted at their drawn moment, "
          f"{MIN_INTERRUPTED} required ({time.monotonic() - began:.0f} s)")  # fmt: skip
    assert interrupted >= MIN_INTERRUPTED
    # a SIGKILL during the final writes: the writer of heldout.json killed between write and rename
    left = [killed_mid_write(study_dir / "heldout.json")]
    left.append(study_dir / ".recommended.json.abcd_123.tmp")  # an older version's name (no pid)
    left[-1].write_text("{")
    os.utime(left[-1], (time.time() - LEGACY_AGE_S - 1,) * 2)
    final = tmp_path / "final.log"
    proc = _start(argv, tmp_path, final)
    try:
        rc = proc.wait(timeout=120)
    finally:
        _stop(proc)
    # no clock on the whole: each run's wait is bounded above (60 s, 120 s), so a stuck run fails, not hangs
    assert rc == 0, final.read_text(errors="replace")[-3000:]
    seen += final.read_text(errors="replace")
    assert [m for m in MOMENTS if m not in seen] == []  # every moment is a line some run printed

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_dir / 'study.db'}")
    trials = study.get_trials()
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == n_warm_starts(), [(t.number, t.state.name) for t in trials]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert_evaluated_once(finished)

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{study_dir / 'mlflow.db'}")
    assert client.get_run(study.user_attrs["mlflow_parent_run_id"]).info.status == "FINISHED"

    files = [p for p in study_dir.rglob("*.json") if p.is_file()]
    assert study_dir / "pareto.json" in files
    for path in files:
        json.loads(path.read_text())  # raises on a truncated or half-written file
    assert not list(study_dir.glob("*.creating-*"))  # no half-made store of a killed run is left behind
    assert not [p for p in left if p.exists()]
    temporaries = [p for p in study_dir.rglob(".*") if p.name.endswith(".tmp") or ".tmp-" in p.name]
    assert temporaries == []  # no temporary of any write survives the final run
    recommended = study_dir / "recommended.json"
    if recommended.exists():
        assert "confirmation" in json.loads(recommended.read_text())["metadata"]
