"""Token importance: the attention probability the last position pays to each active token.

Computed from the query of the last position and the active keys only (``q_last . K^T``), so the
attention kernel itself can stay ``sdpa``; the full attention matrix is never materialised.
"""

from __future__ import annotations

import torch


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
