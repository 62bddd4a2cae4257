"""The MLflow UI section of the docs (docs/mlflow.md, linked from the README), tested as written.

Runs a finished tiny study with the default stores, starts the README's own ``mlflow ui`` command
(read from docs/mlflow.md; only the study folder and the port are substituted) on 127.0.0.1, and checks
through the REST API what the README promises: experiment ``lazyllm-tuner``, a parent run named after
the study that is FINISHED, children ``trial-<n>`` nested under it with the metrics the README names,
the parent's and the trials' artifacts, and the runs-table URL serving the UI. Then loads the URL the
study printed last in a fresh headless Chromium (Debian's ``chromium``) and reads the runs table off
the rendered page: the parent run by name, no GenAI overview.
"""

from __future__ import annotations

import contextlib
import html
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support import longbench_dir, stop_process_group, wait_for_http
from tuner.search import main

README = Path(__file__).resolve().parents[3] / "docs" / "mlflow.md"  # the README's MLflow page
README_STUDY = "runs/smollm2-135m-qa-stages"
README_METRICS = {  # the default study measures fidelity (README: kl and top1, the loss with its interval)
    "speedup",
    "accuracy_loss",
    "accuracy_loss_low",
    "accuracy_loss_high",
    "accuracy_loss_upper",
    "kl",
    "top1",
    "flop_speedup",
    "prompt_computed_pct",
}
PARENT_FILES = {"pareto.json", "pareto.csv", "pareto.png", "pareto.html", "keep_curves.png", "keep_curves.html",
                "recommended.json", "pareto"}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readme_ui_command() -> list[str]:
    """The README's ``mlflow ui`` command line, split into arguments."""
    lines = [line for line in README.read_text().splitlines() if " ui --backend-store-uri " in line]
    assert len(lines) == 1, "the README should show exactly one `mlflow ui` command"
    return lines[0].strip().split()


def readme_runs_table_url() -> str:
    match = re.search(r"http://127\.0\.0\.1:5000/\S*workflowType=machine_learning\S*", README.read_text())
    assert match, "the README should give the runs-table URL (workflowType=machine_learning)"
    return match[0].rstrip(").,`")


def _get(base: str, path: str, **query: str) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(query)}" if query else base + path
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _post(base: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def _files(base: str, run_id: str) -> set[str]:
    return {f["path"] for f in _get(base, "/api/2.0/mlflow/artifacts/list", run_id=run_id).get("files", [])}


def page_text(url: str, profile: Path) -> str:
    """The text of ``url`` as a fresh headless Chromium renders it (scripts run, the DOM dumped), or a
    skip where Chromium is absent outside CI (in CI, CI=true, a failure)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium not found: CI installs Debian's chromium (.ci/run)")
        pytest.skip("chromium not installed (apt-get install chromium): the page is not checked in a browser")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--virtual-time-budget=30000", "--dump-dom"]  # fmt: skip
    done = subprocess.run([chromium, *flags, url], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", done.stdout, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


def test_readme_ui_shows_what_it_promises(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = [
        "--model", str(tiny_folder), "--task", "hotpotqa,trec", "--n-examples", "1", "--max-prompt-tokens", "128",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", "runs",
        "--study-name", "ui-study", "--sampler", "random", "--n-trials", "2", "--no-heldout",
    ]  # fmt: skip
    monkeypatch.chdir(tmp_path)  # the printed command is relative to the working folder, as a user runs it
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    last = printed.getvalue().strip().splitlines()[-3:]  # the study's last lines say how to open the UI
    command = (
        next(line for line in last if line.startswith("MLflow UI: ")).removeprefix("MLflow UI: ").split()
    )
    shown = re.search(
        r"http://127\.0\.0\.1:5000/#/experiments/(\w+)\?workflowType=machine_learning", "\n".join(last)
    )
    assert shown, last
    assert command[1:] == ["ui", "--backend-store-uri", "sqlite:///runs/ui-study/mlflow.db", "--host", "127.0.0.1",
                           "--port", "5000"]  # fmt: skip

    port = free_port()
    cmd = readme_ui_command()
    assert cmd[0] == ".venv/bin/mlflow" and f"sqlite:///{README_STUDY}/mlflow.db" in cmd
    cmd[0] = str(Path(sys.executable).with_name("mlflow"))  # this environment's venv
    cmd = [a.replace(README_STUDY, "runs/ui-study") for a in cmd]
    cmd[cmd.index("--port") + 1] = str(port)
    assert "127.0.0.1" in cmd  # never 0.0.0.0
    log = (tmp_path / "ui.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_http(base + "/health", proc, tmp_path / "ui.log", what="mlflow ui", timeout=90)

        experiment = _get(base, "/api/2.0/mlflow/experiments/get-by-name", experiment_name="lazyllm-tuner")
        exp_id = experiment["experiment"]["experiment_id"]
        kind = {t["key"]: t["value"] for t in experiment["experiment"].get("tags", [])}
        assert kind.get("mlflow.experimentKind") == "custom_model_development"  # the UI opens on the runs
        runs = _post(base, "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp_id], "max_results": 100})[
            "runs"
        ]
        parents = [r for r in runs if _tags(r).get("lazyllm.role") == "study"]
        children = [r for r in runs if _tags(r).get("lazyllm.role") == "trial"]
        assert len(parents) == 1 and len(children) == 2
        parent = parents[0]
        assert parent["info"]["run_name"] == "ui-study"
        assert parent["info"]["status"] == "FINISHED" and int(parent["info"]["end_time"]) > 0
        assert _files(base, parent["info"]["run_id"]) >= PARENT_FILES
        assert sorted(c["info"]["run_name"] for c in children) == ["trial-0", "trial-1"]
        for child in children:
            assert _tags(child)["mlflow.parentRunId"] == parent["info"]["run_id"]  # nested in the UI
            assert child["info"]["status"] == "FINISHED"
            assert {m["key"] for m in child["data"]["metrics"]} >= README_METRICS
            assert "schedule.json" in _files(base, child["info"]["run_id"])
            with urllib.request.urlopen(
                f"{base}/get-artifact?path=schedule.json&run_uuid={child['info']['run_id']}", timeout=30
            ) as resp:
                assert json.loads(resp.read())["format"] == "lazyllm-schedule"

        # the README's runs-table URL: the UI page itself (the part after '#' is read by the browser)
        url = readme_runs_table_url().replace("127.0.0.1:5000", f"127.0.0.1:{port}")
        assert url.endswith(f"/#/experiments/{exp_id}?workflowType=machine_learning")  # a new store's id
        with urllib.request.urlopen(url.split("#", 1)[0], timeout=30) as resp:
            assert resp.status == 200 and b"<html" in resp.read(2000).lower()

        # the URL the study printed, in a real browser: the runs table with the study's parent run
        assert shown[1] == exp_id
        text = page_text(shown[0].replace("127.0.0.1:5000", f"127.0.0.1:{port}"), tmp_path / "chromium")
        assert "Run Name" in text and "ui-study" in text and "3 matching runs" in text, text[:2000]
        assert "Traces 0" not in text and "No data available" not in text  # not the GenAI overview
    finally:
        stop_process_group(proc)
        log.close()


@pytest.mark.parametrize("metric", sorted(README_METRICS))
def test_readme_names_the_metrics(metric: str) -> None:
    assert f"`{metric}`" in README.read_text()


def test_docs_show_what_a_study_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/mlflow.md's command and URL are :func:`tuner.tracking.ui.ui_lines` for the README's study."""
    from tuner.tracking.ui import ui_lines

    root = README.parents[1]
    monkeypatch.chdir(root)
    study = f"sqlite:///{root / README_STUDY / 'mlflow.db'}"
    command, url = ui_lines(study, "1")
    assert command == "MLflow UI: " + " ".join(readme_ui_command())
    assert url.endswith(readme_runs_table_url())
    assert ui_lines("http://user:secret@host:5000/", "7") == [
        "MLflow UI, the runs table: http://***@host:5000/#/experiments/7?workflowType=machine_learning"
    ]
