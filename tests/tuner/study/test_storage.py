"""tuner.study.storage: the study's identity guards it, warm starts are queued once, storage errors are one masked line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.study.settings import SearchSettings
from tuner.study.spaces import load_space
from tuner.study.storage import make_storage, open_study, study_lock, warm_start


def _settings(tmp_path: Path, **changes: object) -> SearchSettings:
    return SearchSettings(output=str(tmp_path), study_name="s", **changes)  # type: ignore[arg-type]


def test_a_study_made_with_other_settings_is_refused(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    storage = make_storage(f"sqlite:///{tmp_path / 'study.db'}")
    try:
        study = open_study(settings, 30, storage)
        assert (
            study.user_attrs["identity"] == settings.study_identity() and study.user_attrs["num_layers"] == 30
        )
        assert study.metric_names == ["speedup", "accuracy_loss"]
        assert open_study(settings, 30, storage).study_name == "s"  # the same settings resume it
        with pytest.raises(
            ValueError,
            match=r"made with other settings \{'max_accuracy_loss': \(2.0, 1.0\), 'search_cap': \(",
        ):  # the prior-derived cap follows the budget
            open_study(_settings(tmp_path, max_accuracy_loss=1.0), 30, storage)
    finally:
        storage.engine.dispose()


def test_a_study_stored_before_a_setting_existed_resumes_with_its_old_meaning(tmp_path: Path) -> None:
    """A study stored before ``dtype`` was a setting ran with the device's default: it resumes with
    ``auto`` and refuses ``bfloat16``."""
    storage = make_storage(f"sqlite:///{tmp_path / 'study.db'}")
    try:
        study = open_study(_settings(tmp_path), 30, storage)
        old = {k: v for k, v in study.user_attrs["identity"].items() if k != "dtype"}
        study.set_user_attr("identity", old)
        assert open_study(_settings(tmp_path), 30, storage).study_name == "s"
        with pytest.raises(ValueError, match=r"other settings \{'dtype': \('auto', 'bfloat16'\)\}"):
            open_study(_settings(tmp_path, dtype="bfloat16"), 30, storage)
    finally:
        storage.engine.dispose()


def test_warm_starts_are_queued_once(tmp_path: Path) -> None:
    storage = make_storage(f"sqlite:///{tmp_path / 'study.db'}")
    try:
        study = open_study(_settings(tmp_path), 30, storage)
        space = load_space("stages")
        warm_start(study, space, 30)
        warm_start(study, space, 30)  # a resume: nothing queued again
        trials = study.get_trials()
        assert trials[0].user_attrs == {"keep_all": True}  # the reference trial, no parameters
        assert [t.system_attrs["fixed_params"] for t in trials[1:]] == space.warm_start(30)
    finally:
        storage.engine.dispose()


def test_storage_errors_are_one_line_with_the_password_masked(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        make_storage("postgresql+psycopg://bob:s3cret@127.0.0.1:1/db")
    text = str(info.value)
    assert "s3cret" not in text and "bob:***@" in text and "\n" not in text


def test_study_lock_makes_the_folder_and_is_reentrant_across_uses(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    with study_lock(folder):
        assert (folder / ".lock").exists()
    with study_lock(folder):  # released: a second use does not block
        pass
