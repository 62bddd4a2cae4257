"""lazyllm.attention: masks checked pair by pair, and layer views that leave the model untouched."""

from __future__ import annotations

import pytest
import torch

from lazyllm.attention import ATTENTION_NAME, causal_mask, lazyllm_layers, query_key_mask
from tests.support import make_tiny


def test_query_key_mask_is_causal_windowed_and_respects_inactive_keys() -> None:
    q, k = torch.tensor([2, 5, 9]), torch.tensor([0, 2, 5, 8, 9])
    mask = query_key_mask(q, k, torch.tensor([True, True, False, True, True]), 4, torch.float32)[0, 0]
    allowed = (mask == 0).tolist()
    for i, qp in enumerate(q.tolist()):
        for j, kp in enumerate(k.tolist()):
            assert allowed[i][j] == (kp <= qp and qp - kp < 4 and kp != 5), (qp, kp)
    assert mask.min() == torch.finfo(torch.float32).min


def test_causal_mask_is_none_where_sdpa_is_causal_is_exact() -> None:
    pos = torch.tensor([0, 1, 2, 3])
    assert causal_mask(pos, None, torch.float32, explicit=False) is None
    assert causal_mask(pos, 8, torch.float32, explicit=False) is None  # the window covers every pair
    explicit = causal_mask(pos, None, torch.float32, explicit=True)
    assert explicit is not None and ((explicit[0, 0] == 0) == torch.ones(4, 4).tril().bool()).all()
    assert causal_mask(pos, 2, torch.float32, explicit=False) is not None


def test_layer_views_share_weights_and_never_change_the_model() -> None:
    model = make_tiny("llama")
    layers = list(model.model.layers)
    views, kernel = lazyllm_layers(model, layers)
    assert kernel == model.config._attn_implementation == "sdpa"
    for view, layer in zip(views, layers):
        assert view is not layer and view.self_attn.config._attn_implementation == ATTENTION_NAME
        assert view.self_attn.q_proj.weight is layer.self_attn.q_proj.weight  # shared, not copied
    assert all(layer.self_attn.config._attn_implementation == "sdpa" for layer in layers)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        lazyllm_layers(model, layers)
