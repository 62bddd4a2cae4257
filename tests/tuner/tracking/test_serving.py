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
from collections.abc import Iterator
from dataclasses import dataclass
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
    messages = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": PROMPT}]
    chat = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False).generate(
        messages, max_new_tokens=MAX_NEW
    )

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
        # the same server speaks OpenAI's chat completions (temperature 0: greedy)
        answer = _post(base + "/invocations", {"messages": messages, "max_tokens": MAX_NEW, "temperature": 0})
        assert answer["choices"][0]["message"]["content"] == chat.text
        assert answer["usage"]["prompt_tokens"] == chat.prompt_tokens
        assert answer["lazyllm"]["prompt_computed_fraction"] == pytest.approx(chat.prompt_computed_fraction)
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


@dataclass(frozen=True)
class Served:
    """A saved schedule model of the tiny checkpoint, served by ``mlflow models serve`` on ``base``."""

    folder: Path
    base: str
    schedule: Schedule


@pytest.fixture(scope="module")
def tiny_served(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server start for every HTTP test of the tiny model (each start costs tens of seconds)."""
    from tuner.tracking.serving import save_model

    tmp_path = tmp_path_factory.mktemp("served")
    schedule = Schedule("tiny", (0.0, 50.0, 30.0, 0.0), revival="frozen")
    folder = save_model(schedule, tmp_path / "model", base_model=str(tiny_folder))
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
        yield Served(folder, base, schedule)
    finally:
        stop_process_group(proc)
        log.close()
    assert proc.poll() is not None


def test_over_long_prompt_is_refused_unless_truncation_is_asked(tiny_served: Served) -> None:
    """Issue 21 item 10: a prompt over the context is a 400 naming the limit, or cut when asked and said so."""
    base = tiny_served.base
    context = 4096  # the tiny checkpoint's max_position_embeddings
    long_prompt = "word " * (context + 200)
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


MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Name a colour."},
]


def _engine(tiny_folder: Path, schedule: Schedule) -> LazyLLM:
    from lazyllm.models import load_model

    model, tokenizer = load_model(str(tiny_folder), device="cpu")
    return LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False)


def test_served_model_answers_openai_chat_completions(tiny_served: Served, tiny_folder: Path) -> None:
    """Issue 31: `messages` in, `choices`, `usage` and the share of prompt pairs computed out (real
    server, real HTTP); sampled with a seed it is the engine's own answer; malformed bodies are 400s."""
    engine = _engine(tiny_folder, tiny_served.schedule)
    url = tiny_served.base + "/invocations"
    body = {"model": "anything", "messages": MESSAGES, "max_tokens": 7, "temperature": 0.9, "top_p": 0.95,
            "seed": 11, "stop": ["\n\n\n"]}  # fmt: skip
    expected = engine.generate(
        MESSAGES, max_new_tokens=7, stop_strings=["\n\n\n"], do_sample=True, temperature=0.9, top_p=0.95,
        top_k=0, seed=11,
    )  # fmt: skip
    status, answer = _post_status(url, body)
    assert status == 200, answer
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    (choice,) = answer["choices"]
    assert choice["message"] == {"role": "assistant", "content": expected.text}
    assert choice["finish_reason"] == ("length" if expected.finish_reason == "length" else "stop")
    n = expected.prompt_tokens
    assert answer["usage"] == {"prompt_tokens": n, "completion_tokens": 7, "total_tokens": n + 7}
    fraction = answer["lazyllm"]["prompt_computed_fraction"]
    assert fraction == pytest.approx(expected.prompt_computed_fraction) and fraction < 1.0
    assert answer["lazyllm"]["revival"] == "frozen"
    status, greedy = _post_status(url, {"messages": MESSAGES, "max_tokens": 5, "temperature": 0})
    assert status == 200
    assert greedy["choices"][0]["message"]["content"] == engine.generate(MESSAGES, max_new_tokens=5).text
    for bad, said in [
        ({"messages": [], "max_tokens": 4}, "messages must be a non-empty list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role = 'robot'"),
        ({"messages": MESSAGES, "temperature": "hot"}, "temperature = 'hot': must be a number"),
        ({"messages": MESSAGES, "temperature": 3}, "temperature = 3.0: must be in [0, 2]"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens = 0: must be an integer >= 1"),
        ({"messages": MESSAGES, "n": 2}, "only one choice per request"),
        ({"messages": MESSAGES, "stream": True}, "has no streaming"),
        ({"messages": MESSAGES, "tools": []}, "unsupported fields ['tools']"),
        ({"messages": MESSAGES, "stop": [""]}, "stop = ['']"),
    ]:
        status, answer = _post_status(url, bad)
        assert status == 400, (bad, answer)
        # MLflow's server puts a line "Failed to predict data ..." before the model's own one-line error
        assert answer["message"].splitlines()[-1].startswith("Error: "), answer
        assert said in answer["message"].splitlines()[-1], (bad, answer)
    status, answer = _post_status(url, {"max_tokens": 4})  # neither messages nor inputs: MLflow's own 400
    assert status == 400 and "input fields" in answer["message"]


def test_predict_stream_yields_openai_chunks(tiny_served: Served) -> None:
    """In Python, the loaded model streams chat chunks whose text is the blocking answer's."""
    import mlflow.pyfunc

    loaded = mlflow.pyfunc.load_model(str(tiny_served.folder))
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 1.0, "seed": 2, "stream": True}
    chunks = list(loaded.predict_stream(body))
    blocking = loaded.predict({**body, "stream": False})
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == blocking["choices"][0]["message"]["content"] and len(chunks) > 3
    assert chunks[-1]["choices"][0]["finish_reason"] == blocking["choices"][0]["finish_reason"]
    assert chunks[-1]["usage"] == blocking["usage"] and "lazyllm" in chunks[-1]
