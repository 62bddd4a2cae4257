"""How to open a study's runs in MLflow's UI: the command that serves its store and the URL of the runs.

MLflow 3 opens an experiment on its GenAI overview (traces) whatever the experiment's tags say; the
query ``workflowType=machine_learning`` opens it on the runs table, where the study's parent run and
its ``trial-<n>`` children are. A study prints these lines last (:func:`ui_lines`); docs/mlflow.md
shows the same, and ``tests/tuner/tracking/test_mlflow_ui.py`` loads the printed URL in headless
Chromium and reads the runs table off the page.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from tuner.redact import redact_url
from tuner.study.storage import sqlite_path

UI_HOST = "127.0.0.1"
"""Where ``mlflow ui`` listens in the printed command: this machine only (never 0.0.0.0)."""
UI_PORT = 5000
"""``mlflow ui``'s own default port."""


def runs_table_url(base: str, experiment_id: str) -> str:
    """The URL of experiment ``experiment_id``'s runs table on the MLflow server at ``base``."""
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}?workflowType=machine_learning"


def _mlflow_command() -> str:
    """This environment's ``mlflow`` script, relative to the working folder where it is inside it."""
    script = Path(sys.executable).with_name("mlflow")
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def _store_uri(tracking_uri: str) -> str:
    """A SQLite store's URI with its file relative to the working folder where it is inside it."""
    file = sqlite_path(tracking_uri)
    if file is None:
        return redact_url(tracking_uri)
    try:
        return f"sqlite:///{Path(os.path.abspath(file)).relative_to(Path.cwd())}"
    except ValueError:
        return tracking_uri


def ui_lines(tracking_uri: str, experiment_id: str) -> list[str]:
    """The console lines that open a study's runs: for a server (``http(s)://``) its runs-table URL;
    for a local store the ``mlflow ui`` command that serves it on :data:`UI_HOST`:`UI_PORT`, then the URL."""
    if tracking_uri.startswith(("http://", "https://")):
        return [f"MLflow UI, the runs table: {runs_table_url(redact_url(tracking_uri), experiment_id)}"]
    command = [_mlflow_command(), "ui", "--backend-store-uri", _store_uri(tracking_uri)]
    command += ["--host", UI_HOST, "--port", str(UI_PORT)]
    return [
        f"MLflow UI: {shlex.join(command)}",
        f"  then open the runs table: {runs_table_url(f'http://{UI_HOST}:{UI_PORT}', experiment_id)}",
    ]
