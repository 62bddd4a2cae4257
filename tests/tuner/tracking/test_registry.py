"""Model Registry for promoted schedules: tuner.search --register, tuner.export --register/--alias,
Schedule.from_mlflow("models:/NAME@alias" | "models:/NAME/<n>"), and export never creating stores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner import export as export_cli
from tuner.search import main
from tuner.tracking.registry import MODEL_ARTIFACT


@pytest.fixture(scope="module")
def study_dir(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A finished 2-trial study on the tiny model (default SQLite stores) that registered its pick."""
    out = tmp_path_factory.mktemp("registry")
    argv = [
        "--model", str(tiny_folder), "--task", "hotpotqa,trec", "--n-examples", "1", "--max-prompt-tokens", "128",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "reg",
        "--sampler", "random", "--n-trials", "2", "--no-heldout", "--register", "from-search",
    ]  # fmt: skip
    assert main(argv) == 0
    yield out / "reg"


def _uri(study_dir: Path) -> str:
    return f"sqlite:///{study_dir / 'mlflow.db'}"


def _storage(study_dir: Path) -> str:
    return f"sqlite:///{study_dir / 'study.db'}"


def test_search_registers_the_recommended_schedule(study_dir: Path) -> None:
    client = MlflowClient(tracking_uri=_uri(study_dir), registry_uri=_uri(study_dir))
    versions = client.search_model_versions("name = 'from-search'")
    assert [str(v.version) for v in versions] == ["1"]
    recommended = Schedule.load(study_dir / "recommended.json")
    assert versions[0].tags["trial"] == str(recommended.metadata["trial"])
    assert client.get_registered_model("from-search").aliases == {}  # no alias unless asked for
    loaded = Schedule.from_mlflow("models:/from-search/1", tracking_uri=_uri(study_dir))
    assert loaded.percentiles == recommended.percentiles


def test_export_registers_versions_with_tags_and_alias(study_dir: Path, tmp_path: Path) -> None:
    uri = _uri(study_dir)
    base = ["--study-name", "reg", "--storage", _storage(study_dir), "--out", str(tmp_path / "x"),
            "--tracking-uri", uri, "--register", "qa-schedule"]  # fmt: skip
    assert export_cli.main(base) == 0
    assert export_cli.main([*base, "--alias", "champion"]) == 0
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    model = client.get_registered_model("qa-schedule")
    assert {k: str(v) for k, v in model.aliases.items()} == {"champion": "2"}
    version = client.get_model_version("qa-schedule", "2")
    study = optuna.load_study(study_name="reg", storage=_storage(study_dir))
    best = study.trials[int(version.tags["trial"])]
    assert float(version.tags["metric.speedup"]) == pytest.approx(best.values[0])
    assert float(version.tags["metric.accuracy_loss"]) == pytest.approx(best.values[1])
    assert version.tags["study"] == "reg" and version.tags["speedup_kind"] == "flops"
    assert version.tags["storage"] == _storage(study_dir)
    # the version's run is the trial's own run, which now holds the MLflow model
    run = client.get_run(version.run_id)
    assert run.data.tags["optuna.trial"] == version.tags["trial"]
    assert MODEL_ARTIFACT in {a.path for a in client.list_artifacts(version.run_id)}
    by_alias = Schedule.from_mlflow("models:/qa-schedule@champion", tracking_uri=uri)
    by_number = Schedule.from_mlflow("models:/qa-schedule/1", tracking_uri=uri)
    assert by_alias == by_number == Schedule.load(study_dir / "recommended.json")
    with pytest.raises(ValueError, match="models:/NAME@alias or models:/NAME/<version number>"):
        Schedule.from_mlflow("models:/qa-schedule/latest-ish", tracking_uri=uri)
    with pytest.raises(ValueError, match="cannot download models:/qa-schedule@nobody"):
        Schedule.from_mlflow("models:/qa-schedule@nobody", tracking_uri=uri)


def test_export_registers_a_run(study_dir: Path) -> None:
    uri = _uri(study_dir)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run_id = next(r for r in client.search_runs(["1"]) if r.data.tags.get("optuna.trial") == "0").info.run_id
    argv = ["--mlflow-run", run_id, "--tracking-uri", uri, "--register", "from-run", "--alias", "staging"]
    assert export_cli.main(argv) == 0
    assert Schedule.from_mlflow("models:/from-run@staging", tracking_uri=uri).metadata["trial"] == 0


def test_export_never_creates_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    missing = tmp_path / "nowhere" / "study.db"
    assert export_cli.main(["--study-name", "x", "--storage", f"sqlite:///{missing}"]) == 2
    assert "no study storage" in capsys.readouterr().err
    assert export_cli.main(["--mlflow-run", "0123456789abcdef", "--out", "s.json"]) == 2
    assert "no MLflow store" in capsys.readouterr().err
    bogus = tmp_path / "mlruns.db"
    argv = ["--mlflow-run", "0123456789abcdef", "--register", "m", "--tracking-uri", f"sqlite:///{bogus}"]
    assert export_cli.main(argv) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no mlflow.db, no study.db, nothing
    assert not missing.parent.exists()


def test_bad_names_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert export_cli.main(["--mlflow-run", "r", "--register", "bad name"]) == 2
    assert "registered model name 'bad name'" in capsys.readouterr().err
    assert export_cli.main(["--mlflow-run", "r", "--register", "ok", "--alias", "latest"]) == 2
    assert "alias 'latest'" in capsys.readouterr().err
    assert export_cli.main(["--mlflow-run", "r", "--out", "s.json", "--alias", "champion"]) == 2
    assert "--alias needs --register" in capsys.readouterr().err
