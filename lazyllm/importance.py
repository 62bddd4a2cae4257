"""Token importance: the attention a window of the newest queries pays to each active token.

Computed from those queries and the active keys only (``q_window . K^T``, ``w x K`` per head), so
the attention kernel itself can stay ``sdpa``; the full attention matrix is never materialised.
How the per-head scores become one score per token is the rule's (:mod:`lazyllm.scoring`).
"""

from __future__ import annotations

import torch

MASKED_LOGIT = -1e9
"""The raw score of a key a window query may not see (below every real logit)."""


def last_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    key_mask: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Mean-over-heads softmax attention of the last query over the keys.

    Args:
        query: ``[B, H, Q, D]`` queries after rotary embedding (only ``query[:, :, -1]`` is used).
        key: ``[B, KVH, K, D]`` keys after rotary embedding; ``H`` must be a multiple of ``KVH`` (GQA).
        scaling: the model's attention scaling (usually ``D ** -0.5``).
        key_mask: optional ``[K]`` bool, True where the last query may attend (sliding windows).
        softcap: attention logit soft-capping, as the model applies it (Gemma 2 style), or None.

    Returns:
        ``[B, K]`` float32 probabilities; each row sums to 1 over the allowed keys.
    """
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads is not a multiple of {kv_heads} key/value heads")
    q_last = query[:, :, -1, :].reshape(batch, kv_heads, heads // kv_heads, dim).float()  # [B, KVH, G, D]
    logits = torch.einsum("bkgd,bknd->bkgn", q_last, key.float()) * scaling  # [B, KVH, G, K]
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if key_mask is not None:
        logits = logits.masked_fill(~key_mask, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return probs.mean(dim=(1, 2))  # [B, K]


def window_scores(
    queries: torch.Tensor,
    key: torch.Tensor,
    scaling: float,
    allowed: torch.Tensor | None,
    softcap: float | None = None,
    values: str = "softmax",
) -> torch.Tensor:
    """Per-head scores of the keys by a window of queries, summed over the window (a :class:`~lazyllm.scoring.Scoring`'s steps 1-2).

    Args:
        queries: ``[1, H, w, D]`` the window's queries after rotary embedding.
        key: ``[1, KVH, K, D]`` keys after rotary embedding; ``H`` a multiple of ``KVH`` (GQA).
        scaling: the model's attention scaling (usually ``D ** -0.5``).
        allowed: ``[w, K]`` bool, True where window query ``i`` may see key ``j`` (None: all).
        softcap: attention logit soft-capping (Gemma 2 style), or None.
        values: ``"softmax"`` (probabilities; a row with no allowed key scores 0) or ``"raw"``
            (scaled logits; disallowed keys score :data:`MASKED_LOGIT`).

    Returns:
        ``[H, K]`` float32. With ``w = 1`` and ``softmax`` these are the probabilities whose mean over
        heads is :func:`last_query_attention` (the same operations, bit for bit).
    """
    _, heads, w, dim = queries.shape
    kv_heads = key.shape[1]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads is not a multiple of {kv_heads} key/value heads")
    groups = heads // kv_heads
    if w == 1:
        q = queries[:, :, -1, :].reshape(1, kv_heads, groups, dim).float()  # [1, KVH, G, D]
        logits = torch.einsum("bkgd,bknd->bkgn", q, key.float()) * scaling  # [1, KVH, G, K]
        mask = None if allowed is None else allowed[0]
    else:
        q = queries.reshape(1, kv_heads, groups, w, dim).float()  # [1, KVH, G, w, D]
        logits = torch.einsum("bkgwd,bknd->bkgwn", q, key.float()) * scaling  # [1, KVH, G, w, K]
        mask = allowed
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    if values == "softmax":
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        scores = torch.softmax(logits, dim=-1)
        if w > 1:
            scores = scores.nan_to_num(0.0)  # a window query with no visible key adds nothing
    else:
        scores = logits if mask is None else logits.masked_fill(~mask, MASKED_LOGIT)
    if w > 1:
        scores = scores.sum(dim=-2)  # over the window: [1, KVH, G, K]
    return scores.reshape(heads, -1)
