"""Renamed modules stay importable from their old paths for one release, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("lazyllm.scheduler", "lazyllm.serving.queue", "Job"),
        ("lazyllm.protocol", "lazyllm.serving.protocol", "APIError"),
        ("lazyllm.hf_generate", "lazyllm.apply", "check_options"),
    ],
)
def test_an_old_path_warns_and_gives_the_new_modules_names(old: str, new: str, name: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"import {new} instead"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_the_package_api_is_unchanged() -> None:
    import lazyllm
    from lazyllm.apply import apply

    assert lazyllm.apply is apply and callable(lazyllm.apply)
    for name in lazyllm.__all__:
        assert hasattr(lazyllm, name), name
