"""``python -m tuner.serve``: a schedule registered in MLflow, served to the official ``openai`` client
by the same app as ``python -m lazyllm.serve`` (a real SQLite store, a real server subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai
from mlflow.tracking import MlflowClient

from lazyllm.engine import LazyLLM
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from tests.support import served
from tuner.tracking.registry import register_schedule

MESSAGES = [{"role": "user", "content": "Name a colour."}]


def test_registered_version_serves_to_the_openai_client(tiny_folder: Path, tmp_path: Path) -> None:
    schedule = Schedule("tiny", (0.0, 50.0, 30.0, 0.0), revival="frozen")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment("serving", artifact_location=(tmp_path / "artifacts").as_uri())
    run = client.create_run(experiment, run_name="promoted")
    register_schedule(
        client, schedule, "tiny-qa", run_id=run.info.run_id, alias="champion", base_model=str(tiny_folder)
    )
    model, tokenizer = load_model(str(tiny_folder), device="cpu")
    expected = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False).generate(
        MESSAGES, max_new_tokens=6
    )
    args = ["--model-uri", "models:/tiny-qa@champion", "--tracking-uri", uri]
    with served("tuner.serve", args, tmp_path / "serve.log") as base:
        oai = openai.OpenAI(base_url=base + "/v1", api_key="unused")
        assert [m.id for m in oai.models.list().data] == ["tiny-qa"]  # the registered name
        answer = oai.chat.completions.create(model="tiny-qa", messages=MESSAGES, max_tokens=6, temperature=0)
        assert answer.choices[0].message.content == expected.text
        extension = answer.model_extra["lazyllm"]  # type: ignore[index]
        assert extension["schedule"] == "tuned"
        assert extension["prompt_computed_fraction"] == expected.prompt_computed_fraction < 1.0


def test_an_unknown_version_is_a_one_line_error(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri, registry_uri=uri).search_registered_models()  # creates the store
    cmd = [
        sys.executable,
        "-m",
        "tuner.serve",
        "--model-uri",
        "models:/nobody@champion",
        "--tracking-uri",
        uri,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot download models:/nobody@champion from MLflow"), done.stderr
