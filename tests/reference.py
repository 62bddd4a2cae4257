"""A slow, obviously-correct LazyLLM prefill used as the oracle in tests.

No batching tricks: rotary embeddings are recomputed for the surviving positions at every layer, the
causal mask is built element by element from original positions, importance is read off the full eager
attention matrix (captured with a forward hook), and pruning is a plain Python sort.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _mask(positions: list[int], window: int | None, dtype: torch.dtype) -> torch.Tensor:
    n = len(positions)
    mask = torch.zeros(1, 1, n, n, dtype=dtype)
    for qi, qp in enumerate(positions):
        for ki, kp in enumerate(positions):
            ok = kp <= qp and (window is None or qp - kp < window)
            if not ok:
                mask[0, 0, qi, ki] = torch.finfo(dtype).min
    return mask


def _window(config: Any, layer: int) -> tuple[str, int | None]:
    types = getattr(config, "layer_types", None)
    sw = getattr(config, "sliding_window", None)
    kind = types[layer] if types is not None else "sliding_attention" if sw is not None else "full_attention"
    return kind, (sw if kind == "sliding_attention" else None)


@torch.no_grad()
def reference_prefill(
    model: Any, input_ids: list[int], percentiles: list[float]
) -> tuple[torch.Tensor, list[list[int]], dict[int, list[float]]]:
    """Returns (next-token logits [vocab], positions computed per layer, importance per pruning layer).

    ``model`` must be loaded with ``attn_implementation="eager"``.
    """
    assert model.config._attn_implementation == "eager"
    core = model.model
    ids = torch.tensor([input_ids])
    hidden = core.embed_tokens(ids)
    positions = list(range(len(input_ids)))
    computed: list[list[int]] = []
    importance: dict[int, list[float]] = {}
    for layer_idx, layer in enumerate(core.layers):
        computed.append(list(positions))
        kind, window = _window(model.config, layer_idx)
        pos = torch.tensor([positions])
        if model.config.model_type == "gemma3_text":  # rotary per layer type
            cos, sin = core.rotary_emb(hidden, pos, kind)
        else:
            cos, sin = core.rotary_emb(hidden, pos)
        captured: list[torch.Tensor] = []
        handle = layer.self_attn.register_forward_hook(lambda _m, _i, out, sink=captured: sink.append(out[1]))
        try:
            hidden = layer(
                hidden,
                attention_mask=_mask(positions, window, hidden.dtype),
                position_ids=pos,
                position_embeddings=(cos, sin),
            )
        finally:
            handle.remove()
        p = percentiles[layer_idx]
        n = len(positions)
        k = min(math.floor(p * n / 100 + 1e-9), n - 1) if p > 0 else 0
        if k:
            weights = captured[0][0, :, -1, :].mean(dim=0)  # [n]: mean over heads of the last query's row
            scores = [float(w) for w in weights]
            importance[layer_idx] = scores
            ranked = sorted(range(n - 1), key=lambda i: (scores[i], i))
            dropped = set(ranked[:k])
            keep = [i for i in range(n) if i not in dropped]
            hidden = hidden[:, keep]
            positions = [positions[i] for i in keep]
    logits = model.lm_head(core.norm(hidden[:, -1:]))[0, -1]
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits.float(), computed, importance
