"""Every preset under studies/ loads through the settings loader and means what it says."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import yaml

from lazyllm.models import DEFAULT_MODEL
from tuner.study.settings import NULL, RENAMED, STUDIES_DIR, SearchSettings, load_preset, resolve_settings

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


@pytest.mark.parametrize(("name", "target", "short"), [
    ("qa-4k", 4096, 1024), ("openqa-4k", 4096, 1024), ("qa-8k", 8160, 2048), ("openqa-8k", 8160, 2048),
])  # fmt: skip
def test_the_long_prompt_presets_search_short_and_decide_at_their_length(
    name: str, target: int, short: int
) -> None:
    from tuner.study.context import check_context

    settings = resolve_settings(name, {})
    assert (settings.max_prompt_tokens, settings.search_prompt_tokens) == (target, short)
    assert settings.multi_fidelity and settings.search_eval().max_prompt_tokens == short
    assert settings.evidence_settings("confirm").max_prompt_tokens == target  # decided at the target
    assert settings.evidence_settings("heldout").max_prompt_tokens == target
    check_context(settings.max_prompt_tokens, settings.max_new_tokens, 8192)  # SmolLM2 reads 8192
    assert settings.heldout and settings.fresh_kl_examples > 0  # the same checks as every study
    assert resolve_settings(name, {"search_prompt_tokens": NULL}).multi_fidelity is False  # `none` wins
