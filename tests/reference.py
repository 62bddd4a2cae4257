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


def _rotary(
    model: Any, hidden: torch.Tensor, positions: list[int], kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.tensor([positions])
    if model.config.model_type == "gemma3_text":  # rotary per layer type
        return model.model.rotary_emb(hidden, pos, kind)
    return model.model.rotary_emb(hidden, pos)


def _segment(percentiles: list[float], first: int) -> int:
    """Layers first..m a token revived into layer ``first`` runs, m the next pruning (or last) layer."""
    m = first
    while m < len(percentiles) - 1 and percentiles[m] == 0:
        m += 1
    return m - first + 1


@torch.no_grad()
def reference_generate(
    model: Any, prompt: list[int], percentiles: list[float], max_new_tokens: int, revival: str = "dynamic"
) -> tuple[list[int], list[torch.Tensor], dict[tuple[int, int], int], list[list[set[int]]]]:
    """LazyLLM greedy decoding with per-token bookkeeping and no batching tricks.

    ``revival`` (decoding steps only): ``"dynamic"`` re-selects at every step; ``"frozen"`` makes each
    layer's active set the tokens it has computed plus the new one, pruning nothing; ``"budget:B"``
    re-selects but lets at most B (token, layer) computations besides the new token's happen per step:
    a candidate not yet computed at the next layer costs the layers up to the next pruning layer, the
    lowest-ranked candidates beyond what the budget pays for are pruned first.

    Every token's *input* hidden state at every layer it was computed at is kept (``inp[l][pos]``),
    as is its output (``out[l][pos]``; the outputs of pruned tokens are the Aux Cache). Keys and values
    are never cached: to compute query ``x`` at layer ``l`` the layer is run on the stored inputs of
    the active keys at positions ``<= x`` plus ``x`` itself, and only ``x``'s row is read.

    Returns (generated ids, logits per step, computations per (layer, position), and per step the
    active set of every layer).
    """
    assert model.config._attn_implementation == "eager"
    core = model.model
    layers = len(core.layers)
    inp: list[dict[int, torch.Tensor]] = [{} for _ in range(layers)]
    out: list[dict[int, torch.Tensor]] = [{} for _ in range(layers)]
    count: dict[tuple[int, int], int] = {}
    tokens = list(prompt)
    generated: list[int] = []
    step_logits: list[torch.Tensor] = []
    active_sets: list[list[set[int]]] = []
    n_new = len(prompt)
    policy, _, budget_text = revival.partition(":")
    for step in range(max_new_tokens):
        total = len(tokens)
        t = total - 1
        embeds = core.embed_tokens(torch.tensor([tokens[total - n_new :]]))[0]
        active = list(range(total))
        sets: list[set[int]] = []
        frozen = policy == "frozen" and step > 0
        budget = int(budget_text) if policy == "budget" and step > 0 else None
        for layer_idx, layer in enumerate(core.layers):
            if frozen:  # what this layer computed before, plus t
                active = sorted(set(inp[layer_idx]) | {t})
            sets.append(set(active))
            kind, window = _window(model.config, layer_idx)
            queries = [x for x in active if x not in inp[layer_idx]]
            for x in queries:  # inputs of the tokens this layer computes now
                if layer_idx == 0:
                    inp[0][x] = embeds[x - (total - n_new)]
                else:
                    assert x in out[layer_idx - 1], (
                        f"token {x} has no layer-{layer_idx - 1} output to resume from"
                    )
                    inp[layer_idx][x] = out[layer_idx - 1][x]
            t_attention: dict[int, float] = {}
            for x in queries:
                keys = [k for k in active if k <= x and (window is None or x - k < window)]
                hidden = torch.stack([inp[layer_idx][k] for k in keys])[None]
                cos, sin = _rotary(model, hidden, keys, kind)
                captured: list[torch.Tensor] = []
                handle = layer.self_attn.register_forward_hook(
                    lambda _m, _i, o, sink=captured: sink.append(o[1])
                )
                try:
                    result = layer(
                        hidden,
                        attention_mask=_mask(keys, None, hidden.dtype),
                        position_ids=torch.tensor([keys]),
                        position_embeddings=(cos, sin),
                    )
                finally:
                    handle.remove()
                out[layer_idx][x] = result[0, -1]
                count[(layer_idx, x)] = count.get((layer_idx, x), 0) + 1
                if x == t:
                    probs = captured[0][0, :, -1, :].mean(dim=0)
                    t_attention = {k: float(p) for k, p in zip(keys, probs)}
            p = 0.0 if frozen or layer_idx == layers - 1 else percentiles[layer_idx]
            n = len(active)
            k_drop = min(math.floor(p * n / 100 + 1e-9), n - 1) if p > 0 else 0
            if k_drop or (p > 0 and budget is not None):
                score = t_attention.get
                forbidden: set[int] = set()
                if budget is not None:
                    cost = _segment(percentiles, layer_idx + 1)
                    costly = [x for x in active if x != t and x not in inp[layer_idx + 1]]
                    over = len(costly) - budget // cost
                    if over > 0:
                        forbidden = set(sorted(costly, key=lambda x: (score(x, 0.0), x))[:over])
                ranked = sorted(
                    (x for x in active if x != t),
                    key=lambda x: (-math.inf if x in forbidden else score(x, 0.0), x),
                )
                dropped = set(ranked[: max(k_drop, len(forbidden))])
                active = [x for x in active if x not in dropped]
                if budget is not None:
                    budget -= cost * sum(1 for x in active if x != t and x not in inp[layer_idx + 1])
        active_sets.append(sets)
        logits = model.lm_head(core.norm(out[layers - 1][t][None, None]))[0, -1].float()
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        step_logits.append(logits)
        token = int(logits.argmax())
        generated.append(token)
        tokens.append(token)
        n_new = 1
    return generated, step_logits, count, active_sets
