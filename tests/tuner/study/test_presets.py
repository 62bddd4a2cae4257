"""Every preset under studies/ loads through the settings loader and means what it says."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import yaml

from lazyllm.models import DEFAULT_MODEL
from tuner.study.settings import RENAMED, STUDIES_DIR, SearchSettings, load_preset, resolve_settings

PRESETS = sorted(STUDIES_DIR.glob("*.yaml"))
README = Path(__file__).resolve().parents[3] / "README.md"


def test_there_are_presets() -> None:
    assert {p.stem for p in PRESETS} >= {"qa", "qa-gpu", "openqa"}


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_a_preset_loads_and_every_key_it_names_is_the_setting(path: Path) -> None:
    written = yaml.safe_load(path.read_text())
    assert not set(written) & set(RENAMED), f"{path.name} uses an old setting name"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a preset of ours uses no deprecated spelling
        settings = resolve_settings(path.stem, {})
    assert load_preset(path.stem) == written  # every key kept: a search setting, none dropped
    for key, value in written.items():
        assert getattr(settings, key) == value, key  # no later default or check overrides it
    assert isinstance(settings, SearchSettings)


def test_the_gpu_preset_names_a_real_model_and_is_what_the_gpu_quickstart_runs() -> None:
    written = yaml.safe_load((STUDIES_DIR / "qa-gpu.yaml").read_text())
    model = written.get("model")
    # a hub id (organisation/name), not the packaged CPU model; never loaded here (no hub access)
    assert isinstance(model, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", model), model
    assert model != DEFAULT_MODEL and resolve_settings("qa-gpu", {}).model == model
    assert resolve_settings("qa-gpu", {"model": "my/other-model"}).model == "my/other-model"  # --model wins
    assert "--preset qa-gpu --model" in README.read_text()
