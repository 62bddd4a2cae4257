"""lazyllm.methods: the method registry and the compute matching of the baselines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lazyllm.engine import LazyLLM
from lazyllm.methods import METHODS, make_method, method_names, register_method, static_keep_share
from lazyllm.schedule import Schedule


def test_registry_names_and_errors(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    model, _ = model_pair("llama")
    assert {"baseline", "lazyllm", "random", "static", "compression"} <= set(method_names())
    with pytest.raises(ValueError, match=r"Unknown method 'bogus'\. Available: baseline, compression"):
        make_method("bogus", model, None)
    with pytest.raises(ValueError, match="method 'lazyllm' needs a schedule"):
        make_method("lazyllm", model, None)
    with pytest.raises(ValueError, match="registered twice"):
        register_method("baseline")(METHODS["baseline"].factory)
    base = make_method("baseline", model, None)
    assert isinstance(base, LazyLLM) and all(p == 0 for p in base.schedule.percentiles)


def test_static_matches_the_schedule_compute() -> None:
    # 12 layers: 2 full layers + keep * 10 = computed * 12
    assert static_keep_share(0.6, 12) == pytest.approx((0.6 * 12 - 2) / 10)
    assert static_keep_share(1.0, 12) == 1.0
    assert static_keep_share(0.1, 12) == 0.01  # clipped: static cannot compute less than its scoring layers
    schedule = Schedule.from_layers("tiny-llama", 5, {2: 50})
    computed = sum(schedule.keep_fractions()) / 5
    assert static_keep_share(computed, 5) == pytest.approx((computed * 5 - 2) / 3)
