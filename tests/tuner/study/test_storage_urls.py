"""tuner.study.storage.sqlite_path: the one parser of SQLite URLs (export and tracking use it too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tuner
from tuner.export import existing_tracking_uri, load_existing_study
from tuner.study.storage import check_storage, sqlite_path
from tuner.tracking.runs import check_reachable


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///runs/study.db", "runs/study.db"),
        ("sqlite:////abs/study.db", "/abs/study.db"),
        ("sqlite:///runs/study.db?timeout=5", "runs/study.db"),
        ("sqlite://", None),  # in memory
        ("sqlite:///:memory:", None),
        ("sqlite:///", None),
        ("postgresql://u@h/db", None),
        ("file:///tmp/mlruns", None),
    ],
)
def test_sqlite_path(url: str, path: str | None) -> None:
    assert sqlite_path(url) == (None if path is None else Path(path))


def test_export_and_tracking_read_files_through_it(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'nothing.db'}?timeout=5"
    with pytest.raises(ValueError, match="file not found"):
        load_existing_study("s", missing)
    with pytest.raises(ValueError, match="file not found"):
        existing_tracking_uri(missing)
    check_reachable(f"sqlite:///{tmp_path / 'mlflow.db'}?timeout=5")
    assert not (tmp_path / "mlflow.db").exists()  # a check writes nothing
    # issue 32: a URL names an existing place; a missing folder is refused, not made
    with pytest.raises(ValueError, match=f"its folder {tmp_path / 'sub'} does not exist"):
        check_reachable(f"sqlite:///{tmp_path / 'sub' / 'mlflow.db'}?timeout=5")
    assert not (tmp_path / "sub").exists()


def test_a_storage_in_a_missing_folder_is_refused_naming_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32 item 4: ``--storage sqlite:////nonexistent-dir/x.db`` made the folder and ran."""
    from tests.support import longbench_dir
    from tuner.search import main as search

    missing = tmp_path / "nonexistent-dir" / "x.db"
    with pytest.raises(ValueError, match=f"Optuna storage {missing}: its folder .* does not exist"):
        check_storage(f"sqlite:///{missing}")
    check_storage(f"sqlite:///{tmp_path / 'x.db'}")  # an existing folder: fine
    check_storage(f"sqlite:///{missing}", folder=False)  # the default study folder: made by the run
    out = tmp_path / "out"
    argv = ["--task", "hotpotqa", "--n-examples", "1", "--data-dir", longbench_dir(), "--output", str(out),
            "--storage", f"sqlite:///{missing}", "--tracking-uri", "none"]  # fmt: skip
    assert search(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: Optuna storage {missing}: its folder {missing.parent} does not exist; "
                   "create it or pass another --storage"]  # fmt: skip
    assert not missing.parent.exists() and not out.exists()


def test_no_other_module_slices_sqlite_urls() -> None:
    """A second parser (``url.split("///")``, ``uri[len("sqlite:///"):]``) is how the two drifted."""
    root = Path(tuner.__file__).parent
    modules = sorted(root.rglob("*.py"))  # every sub-package too, not only the top-level modules
    assert root / "study" / "storage.py" in modules and root / "study" / "spaces" / "base.py" in modules
    offenders = []
    for path in modules:
        if path == root / "study" / "storage.py":
            continue
        tree = ast.parse(path.read_text())
        built = {id(c) for f in ast.walk(tree) if isinstance(f, ast.JoinedStr) for c in ast.walk(f)}
        for node in ast.walk(tree):  # f"sqlite:///{file}" builds a URL; a bare "sqlite:///" parses one
            if (
                isinstance(node, ast.Constant)
                and node.value in ("///", "sqlite:///")
                and id(node) not in built
            ):
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
