"""Issue 21: a hostile-but-ordinary user's inputs on the newer surfaces (export and registry, tracking
URIs, caches, seeds, heartbeats, schedule files). Each gives one line naming the problem and the fix,
exit 2, no password and nothing written. Real processes and real servers on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import optuna
import pytest

from lazyllm import generate as generate_cli
from tests.support import audited, database_connects, longbench_dir
from tuner.export import main as export
from tuner.search import main as search
from tuner.tracking.runs import check_reachable

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cret"


def _search_argv(folder: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", "hotpotqa", "--n-examples", "1", "--max-prompt-tokens", "64",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--n-trials", "1",
        "--no-heldout", "--speedup", "flops", *extra,
    ]  # fmt: skip


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), captured.err
    return err[0]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    return env


# ---- 1. export --register with an unreachable tracking server: fast, masked, nothing written --------


def test_export_register_to_an_unreachable_server_fails_fast_and_writes_nothing(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="S", storage=storage, directions=["maximize", "minimize"])
    out = tmp_path / "x"
    argv = ["--study-name", "S", "--storage", storage, "--out", str(out), "--register", "ok",
            "--tracking-uri", f"http://user:{SECRET}@127.0.0.1:1"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "tuner.export", *argv], cwd=tmp_path, env=_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert SECRET not in proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: MLflow tracking server http://***@127.0.0.1:1 is not reachable ([Errno 111] Connection "
        "refused); start it or pass another --tracking-uri"
    ]
    assert not out.exists()
    # fast = one connection attempt, no retry loop (MLflow's client would retry for minutes); counted
    # in this process, where the attempts can be seen
    with audited("socket.connect") as connects:
        assert export(argv) == 2
    assert [args[1] for args in connects] == [("127.0.0.1", 1)] and not out.exists()


# ---- 2. secrets never printed: tracebacks (--debug), log records, warnings --------------------------

_LEAKY = """
import argparse, logging, sys, warnings
from lazyllm.cli import cli_main
from tuner.redact import redact_text
URL = "postgresql://bob:s3/cr@t%s@db:5432/x?password=s3cret&sslmode=require"
def run(args):
    logging.getLogger("optuna").error("cannot open %s", URL)
    warnings.warn("retrying " + URL)
    try:
        raise ConnectionError("driver says " + URL)
    except ConnectionError:
        logging.getLogger("mlflow").exception("failed")
    raise {kind}("while opening " + URL)
sys.exit(cli_main(argparse.ArgumentParser(), run, {argv}, redact=redact_text))
"""


@pytest.mark.parametrize(("kind", "argv"), [("ValueError", "['--debug']"), ("RuntimeError", "[]")])
def test_tracebacks_logs_and_warnings_are_masked(tmp_path: Path, kind: str, argv: str) -> None:
    """A user error under --debug, and a bug (which always keeps its traceback)."""
    script = tmp_path / "leaky.py"
    script.write_text(_LEAKY.format(kind=kind, argv=argv))
    proc = subprocess.run(
        [sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == (2 if kind == "ValueError" else 1)  # --debug keeps bad input's status
    err = proc.stderr
    assert "Traceback (most recent call last)" in err and f"{kind}: while opening" in err, err
    assert "cannot open" in err and "retrying" in err and "ConnectionError: driver says" in err, err
    for fragment in ("s3/cr@t", "cr@t", SECRET):
        assert fragment not in err, err
    assert "postgresql://bob:***@db:5432/x?password=***&sslmode=require" in err


# ---- 3. tracking URIs checked before any state ------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        (f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/db",
         "cannot reach MLflow tracking store postgresql+psycopg://u:***@127.0.0.1:1/db"),
        (f"postgresql://u:{SECRET}@127.0.0.1:1/db", "postgresql://u:***@127.0.0.1:1/db"),
        (f"http://user:{SECRET}@127.0.0.1:1", "MLflow tracking server http://***@127.0.0.1:1 is not reachable ([Errno 111] Connection refused)"),
    ],
)  # fmt: skip
def test_unusable_tracking_uri_is_one_line_before_any_state(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], uri: str, fragment: str
) -> None:
    out = tmp_path / "out"
    with audited("socket.connect") as connects, database_connects() as databases:
        assert search(_search_argv(tiny_folder, out, "--tracking-uri", uri)) == 2
    line = _one_line(capsys)
    assert fragment in line and "--tracking-uri" in line
    assert not out.exists()
    # fast = one connection attempt, no retry loop (MLflow's store creation retries a database 15
    # times, its client a server for minutes); a database driver's attempt is seen by SQLAlchemy
    assert [args[1] for args in connects] + [d[1:] for d in databases] == [("127.0.0.1", 1)]


class _Auth(BaseHTTPRequestHandler):
    """A tracking server stand-in: /health answers 200 to user:s3cret (basic auth), 401 otherwise."""

    def do_GET(self) -> None:
        good = "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode()
        ok = self.path == "/health" and self.headers.get("Authorization") == good
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(b"OK" if ok else b"no")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def auth_server() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Auth)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_http_userinfo_is_sent_as_basic_auth(auth_server: int) -> None:
    check_reachable(f"http://user:{SECRET}@127.0.0.1:{auth_server}")  # answers: no error
    with pytest.raises(ValueError, match="refused the credentials") as err:
        check_reachable(f"http://user:wr%40ng@127.0.0.1:{auth_server}")
    assert "wr%40ng" not in str(err.value) and "http://***@127.0.0.1" in str(err.value)


# ---- 5. a baseline cache of the wrong shape is rebuilt ---------------------------------------------


def test_baseline_cache_of_the_wrong_shape_is_rebuilt(tiny_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = _search_argv(tiny_folder, out, "--tracking-uri", "none", "--confirm-k", "0", "--study-name", "c")
    assert search(argv) == 0
    caches = list((out / "c" / "cache").glob("baseline-*.json"))
    assert caches
    good = {c: json.loads(c.read_text()) for c in caches}
    for shape in ({"entries": []}, {"entries": {"k": [1]}}, [1, 2], {"entries": None}):
        for cache in caches:
            cache.write_text(json.dumps(shape))
        assert search(argv) == 0  # the study is done: the rerun only reads (and rebuilds) the baseline
        for cache in caches:
            assert json.loads(cache.read_text()).keys() == good[cache].keys()
            assert json.loads(cache.read_text())["entries"].keys() == good[cache]["entries"].keys()


# ---- 6, 7. out-of-range seed and heartbeat: refused before anything is written ----------------------


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--seed", "-1"], "seed = -1: must be in 0..4294967295"),
        (["--seed", "99999999999999"], "seed = 99999999999999: must be in 0..4294967295"),
        (["--heartbeat-interval", "100000000000"], "heartbeat_interval = 100000000000: must be in 1..3600"),
        (["--heartbeat-interval", "10", "--heartbeat-grace", "10000000000000"],
         "heartbeat_grace = 10000000000000: must be > heartbeat_interval (10) and <= 604800"),
    ],
)  # fmt: skip
def test_out_of_range_seed_or_heartbeat_writes_nothing(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], fragment: str
) -> None:
    out = tmp_path / "out"
    assert search([*_search_argv(tiny_folder, out, "--tracking-uri", "none"), *flags]) == 2
    assert fragment in _one_line(capsys)
    assert not out.exists()


# ---- 9. every input file is checked before the model loads -----------------------------------------


def test_generate_checks_the_schedule_before_loading_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The model named cannot load at all: an error about the schedule proves it was checked first."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "lazyllm-schedule", "version": 1, "model": "m", "num_layers": 2,
                               "percentiles": [120, 0]}))  # fmt: skip
    base = ["--model", str(tmp_path / "no-model"), "--prompt", "hi"]
    assert generate_cli.main([*base, "--schedule", str(bad)]) == 2
    assert "percentiles[0] = 120" in _one_line(capsys)
    assert generate_cli.main([*base, "--schedule", str(tmp_path / "missing.json")]) == 2
    assert "--schedule" in (line := _one_line(capsys)) and "missing.json: no such file" in line
    assert generate_cli.main([*base, "--revival", "sometimes"]) == 2
    assert "sometimes" in _one_line(capsys)


def test_store_left_half_made_by_a_killed_run_is_cleaned_up(tmp_path: Path) -> None:
    """``kill -9`` during MLflow's table creation skips the cleanup of ``mlflow.db.creating-<pid>``."""
    from tuner.study.storage import prepare_mlflow_store

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    leftovers = [
        tmp_path / f"mlflow.db.creating-{dead.stdout.strip()}",
        tmp_path / f"mlflow.db.creating-{dead.stdout.strip()}-journal",
    ]
    alive = tmp_path / f"mlflow.db.creating-{os.getppid()}"  # a live process's work in progress: kept
    for path in (*leftovers, alive):
        path.write_bytes(b"SQLite format 3\x00half")
    prepare_mlflow_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["mlflow.db", alive.name])


_KILLED_WRITER = """
import os, signal, sqlite3, sys
con = sqlite3.connect(sys.argv[1])
con.execute("PRAGMA cache_size = 1")  # spill changed pages into the file: the journal is hot
con.execute("BEGIN IMMEDIATE")
con.execute("CREATE TABLE junk (x TEXT)")
con.executemany("INSERT INTO junk VALUES (?)", [("x" * 500,)] * 2000)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_store_killed_mid_write_opens_again(tmp_path: Path) -> None:
    """Found by the chaos test: kill -9 in the middle of an MLflow write leaves a hot
    ``mlflow.db-journal``; the next run must roll it back, not fail on a read-only check."""
    from mlflow.tracking import MlflowClient

    from tuner.study.storage import prepare_mlflow_store

    db = tmp_path / "mlflow.db"
    prepare_mlflow_store(f"sqlite:///{db}")
    killed = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(db)], capture_output=True, timeout=60)
    assert killed.returncode == -9 and (tmp_path / "mlflow.db-journal").stat().st_size > 0
    prepare_mlflow_store(f"sqlite:///{db}")  # rolls the journal back
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    assert client.create_experiment("after-the-kill")


def test_export_flags_are_the_settings_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 18: tuner.export's study flags are made from the settings fields (type, name, parsing)."""
    from dataclasses import fields

    from tuner import export as export_cli
    from tuner.study.settings import SearchSettings

    actions = {a.dest: a for a in export_cli._parser()._actions}
    kinds = {f.name: f.type for f in fields(SearchSettings)}
    for name in ("study_name", "storage", "tracking_uri", "max_accuracy_loss", "register"):
        assert actions[name].option_strings == ["--" + name.replace("_", "-")]
        assert actions[name].type is {"float": float, "str | None": str}[str(kinds[name])]
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="S", storage=storage, directions=["maximize", "minimize"])
    out = tmp_path / "x"
    argv = ["--study-name", "S", "--storage", storage, "--out", str(out), "--max-accuracy-loss", "nan"]
    assert export_cli.main(argv) == 2
    assert "--max-accuracy-loss nan: must be a finite number >= 0" in _one_line(capsys)
    assert not out.exists()


def test_raw_slash_in_an_http_password_is_one_masked_line() -> None:
    with pytest.raises(ValueError, match="must be percent-encoded") as err:
        check_reachable("http://user:s3/cret@127.0.0.1:5000")
    assert "s3/cret" not in str(err.value) and "cret" not in str(err.value)


# ---- a slope prior that is missing, not a prior, or another model's: one line, exit 2, nothing written --


def test_a_bad_slope_prior_is_one_line_before_any_state(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.statistics.prior import SlopePrior

    other = SlopePrior(
        "gemma3-270m", "openqa", 1024, 300, ("a",), 12.0, ((0.5, 12.0), (0.99, 20.0)), "rows.jsonl",
        "ab" * 32, "2026-12-02",
    ).save(tmp_path / "gemma.json")  # fmt: skip
    (tmp_path / "junk.json").write_text('{"format": 1}')
    cases = {
        str(tmp_path / "missing.json"): "no such file",
        str(tmp_path / "junk.json"): "not a slope prior file",
        str(other): "was measured on 'gemma3-270m'",
    }
    for spec, words in cases.items():
        out = tmp_path / "out"
        assert search(_search_argv(tiny_folder, out, "--slope-prior", spec)) == 2
        assert words in _one_line(capsys)
        assert not out.exists()  # checked before any state


def test_a_bad_open_qa_folder_for_the_fresh_check_is_one_line_before_any_state(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A LongBench study given --openqa-dir for its fresh-drift check: a folder that is not there, or
    one without the official files, fails in the preflight, before the study folder exists."""
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        str(tmp_path / "missing"): "does not exist or is not a folder",
        str(empty): "no such file (open-QA dataset 'hotpotqa-long', from --openqa-dir)",
    }
    for folder, words in cases.items():
        out = tmp_path / "out"
        assert search(_search_argv(tiny_folder, out, "--openqa-dir", folder)) == 2
        assert words in _one_line(capsys)
        assert not out.exists()
