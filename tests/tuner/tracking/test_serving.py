"""A tuned schedule as an MLflow model: pyfunc predict and `mlflow models serve` give LazyLLM's text.

Real parts only: the packaged SmolLM2 through ``lazyllm.load_model("smollm2-135m")``, a SQLite MLflow
store with a registered version and alias, and ``mlflow models serve`` as a subprocess on 127.0.0.1
(always torn down, bounded waits).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from lazyllm.engine import LazyLLM
from lazyllm.schedule import Schedule
from tests.support import stop_process_group, wait_for_http
from tuner.tracking.registry import register_schedule

PROMPT = "Question: What is the capital of France? Answer in one word."
MAX_NEW = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())


@pytest.mark.integration
def test_registered_schedule_serves_lazyllm_text(
    smollm2: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = smollm2
    schedule = Schedule.paper_style("smollm2-135m", int(model.config.num_hidden_layers))
    expected = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False).generate(
        PROMPT, max_new_tokens=MAX_NEW, chat=True
    )
    assert expected.text.strip()  # something to compare

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment("serving", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(experiment, run_name="promoted")
    version = register_schedule(client, schedule, "smol-qa", run_id=run.info.run_id, alias="champion")
    assert str(version.version) == "1"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    import mlflow.pyfunc

    loaded = mlflow.pyfunc.load_model("models:/smol-qa@champion")
    assert loaded.predict([PROMPT], params={"max_new_tokens": MAX_NEW}) == [expected.text]

    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/smol-qa@champion",
           "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    # MLflow starts `uvicorn` by name: this venv's bin folder must be on PATH (it is not under `make test`)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": path}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(base + "/ping", proc, tmp_path / "serve.log", what="mlflow models serve", timeout=120)
        answer = _post(base + "/invocations", {"inputs": [PROMPT], "params": {"max_new_tokens": MAX_NEW}})
        assert answer == {"predictions": [expected.text]}
    finally:
        stop_process_group(proc)
        log.close()
    assert proc.poll() is not None


def _post_status(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_over_long_prompt_is_refused_unless_truncation_is_asked(tiny_folder: Path, tmp_path: Path) -> None:
    """Issue 21 item 10: a prompt over the context is a 400 naming the limit, or cut when asked and said so."""
    from tuner.tracking.serving import save_model

    schedule = Schedule.keep_all(str(tiny_folder), 4)
    folder = save_model(schedule, tmp_path / "model", base_model=str(tiny_folder))
    context = 4096  # the tiny checkpoint's max_position_embeddings
    long_prompt = "word " * (context + 200)
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", str(folder), "--env-manager", "local",
           "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PATH": path, "PYTHONPATH": root}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(base + "/ping", proc, tmp_path / "serve.log", what="mlflow models serve", timeout=120)
        params = {"max_new_tokens": 4, "chat": False}
        status, answer = _post_status(base + "/invocations", {"inputs": [long_prompt], "params": params})
        assert status == 400, answer
        limit = context - 4
        assert f"the limit is {limit} prompt tokens" in answer["message"]
        assert '"truncate": true' in answer["message"]
        status, answer = _post_status(
            base + "/invocations", {"inputs": [long_prompt, "short"], "params": {**params, "truncate": True}}
        )
        assert status == 200, answer
        cut, short = answer["predictions"]
        assert cut["prompt_tokens"] > limit and cut["truncated_to"] == limit and isinstance(cut["text"], str)
        assert short["truncated_to"] is None and short["prompt_tokens"] < limit
        status, answer = _post_status(base + "/invocations", {"inputs": ["short"], "params": params})
        assert status == 200 and isinstance(answer["predictions"][0], str)  # the plain form is unchanged
    finally:
        stop_process_group(proc)
        log.close()
