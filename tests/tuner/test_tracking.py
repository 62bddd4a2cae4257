"""MLflow tracking against a real `mlflow server` (SQLite backend) on a free 127.0.0.1 port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner import export as export_cli
from tuner.search import main
from tuner.tracking import EXPERIMENT


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
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(uri + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}"
                )
            time.sleep(0.5)
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


def test_study_logged_to_server(tiny_folder: Path, tmp_path: Path, mlflow_server: str) -> None:
    assert main(_argv(tiny_folder, tmp_path, mlflow_server, 2)) == 0
    client = MlflowClient(tracking_uri=mlflow_server)
    parents, children = _runs(client)
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.info.run_name == "tracked" and parent.data.tags["model"] == str(tiny_folder)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    for child in children:
        m = child.data.metrics
        assert {"speedup", "accuracy_loss", "score", "baseline_score", "flop_speedup", "prompt_computed_pct",
                "score.hotpotqa", "score.trec"} <= set(m)  # fmt: skip
        assert (
            child.data.params["search_space"] == "stages" and child.data.params["max_prompt_tokens"] == "128"
        )
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
    assert "best_speedup" in parent.data.metrics

    # resume: the same parent, one more child
    assert main(_argv(tiny_folder, tmp_path, mlflow_server, 3)) == 0
    parents, children = _runs(client)
    assert len(parents) == 1 and len(children) == 3

    # export a trial's schedule straight from its run
    out = tmp_path / "from-run.json"
    assert (
        export_cli.main(
            ["--mlflow-run", children[0].info.run_id, "--out", str(out), "--tracking-uri", mlflow_server]
        )
        == 0
    )
    assert Schedule.load(out).num_layers == 4


def test_unreachable_tracking_server_fails_fast(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.monotonic()
    assert main(_argv(tiny_folder, tmp_path, f"http://127.0.0.1:{free_port()}", 1)) == 2
    assert time.monotonic() - start < 15
    assert "is not reachable" in capsys.readouterr().err
    assert not (tmp_path / "tracked" / "study.db").exists()  # nothing ran


def test_two_local_workers_share_one_study(tiny_folder: Path, tmp_path: Path) -> None:
    """Two processes on one study with the default SQLite storage and MLflow store: no lock errors,
    one parent run, one child per finished trial."""
    argv = _argv(tiny_folder, tmp_path, "", 6)
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
    import optuna

    study = optuna.load_study(study_name="tracked", storage=f"sqlite:///{tmp_path / 'tracked' / 'study.db'}")
    finished = [t for t in study.get_trials() if t.state.is_finished()]
    assert len(finished) >= 6
    assert len({t.number for t in finished}) == len(finished)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'tracked' / 'mlflow.db'}")
    parents, children = _runs(client)
    assert len(parents) == 1
    assert sorted(int(c.data.tags["optuna.trial"]) for c in children) == sorted(t.number for t in finished)
