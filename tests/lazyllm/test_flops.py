from __future__ import annotations

import pytest

from lazyllm.flops import ModelDims, flop_speedup, prefill_flops
from lazyllm.schedule import Schedule
from tests.support import make_tiny

DIMS = ModelDims(hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=10, windows=(None, None))


def test_hand_computed_flops() -> None:
    # per token: 2 * (8*8 + 2*8*4 + 8*8 + 3*8*16) = 2 * (64 + 64 + 64 + 384) = 1152
    # attention: 4 * H * D * n(n+1)/2 = 4 * 2 * 4 * 10 = 320 for n = 4;  LM head: 2 * 8 * 10 = 160
    assert prefill_flops(DIMS, [4, 4]) == 160 + 2 * (1152 * 4 + 320)
    # layer 1 with 2 tokens (pruning at layer 0 adds scoring 2*H*D*n = 64)
    assert prefill_flops(DIMS, [4, 2], [True, False]) == 160 + (1152 * 4 + 320 + 64) + (1152 * 2 + 4 * 8 * 3)


def test_speedup_properties() -> None:
    assert flop_speedup(Schedule.keep_all("m", 2), DIMS, 100) == 1.0
    light = flop_speedup(Schedule("m", (20.0, 0.0)), DIMS, 100)
    heavy = flop_speedup(Schedule("m", (80.0, 0.0)), DIMS, 100)
    assert 1.0 < light < heavy < 2.0  # at most half the layers' work can go
    with pytest.raises(ValueError, match="3 layers"):
        flop_speedup(Schedule.keep_all("m", 3), DIMS, 10)


def test_from_config_reads_windows() -> None:
    dims = ModelDims.from_config(make_tiny("qwen2").config)
    assert dims.windows == (None, None, 8, 8, 8)
    assert (dims.heads, dims.kv_heads, dims.head_dim, dims.hidden) == (4, 2, 16, 64)
    # attention in a sliding layer is capped by the window
    assert prefill_flops(dims, [100] * 5) < prefill_flops(
        ModelDims.from_config(make_tiny("llama").config), [100] * 5
    )
