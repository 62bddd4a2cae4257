"""The attention hook of the engine: the model's own kernel plus what LazyLLM needs around it.

The engine runs the model's decoder layers through *views* (:func:`lazyllm_layers`): shallow copies
of each layer and its attention module that share every weight, hook and submodule with the model but
read a copied config whose attention implementation is ``"lazyllm"``. The model itself, its config
included, is never touched, so no lock is needed: several threads may run LazyLLM on one model at
once, and a thread calling the plain model meanwhile gets its ordinary attention. ``"lazyllm"`` is
registered with transformers' ``AttentionInterface``; the wrapper receives each layer's post-rotary
queries, keys and values and

* prepends the keys/values the layer computed in earlier steps (the engine's per-layer KV store),
* scores the active keys by the attention of the newest queries when the layer prunes,
* delegates the attention itself to the model's own kernel (sdpa or eager).

Masks here are additive float masks ``[1, 1, q, k]`` (0 = attend, dtype-min = blocked), which both
sdpa and eager accept.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from lazyllm.importance import window_scores

ATTENTION_NAME = "lazyllm"
CALL_KWARG = "lazyllm_call"
SUPPORTED_KERNELS = ("sdpa", "eager")


@dataclass
class AttentionCall:
    """What one layer's attention call should do besides attending; ``scores`` is filled in by it.

    Attributes:
        inner: the model's own attention implementation ("sdpa" or "eager").
        store: called with the new ``key, value`` ``[1, KVH, q, D]``; returns all keys/values the
            queries may see ``[1, KVH, k, D]`` (None: the new ones are all there is, as in a prefill).
        want_scores: score the keys by the window's queries (:func:`~lazyllm.importance.window_scores`).
        values: ``"softmax"`` or ``"raw"`` (the schedule's :class:`~lazyllm.scoring.Scoring`).
        window: the rule's query window ``w``.
        last_key_mask: ``[k]`` bool, keys the last query may see (None: all); used when ``window == 1``.
        window_mask: ``[w', k]`` bool, keys each window query may see; used when ``window > 1``.
        earlier_queries: in a decoding step, ``[1, H, m, D]`` queries of the window's earlier
            positions (from earlier passes), or None; the window is then those plus the newest query.
            In a prefill (``decoding`` False) the window is the last ``w`` queries of the call.
        scores: ``[H, k]`` float32 per-head window scores, set when ``want_scores``.
        window_queries: ``[1, H, w', D]`` the window's queries, set when ``want_scores`` and ``window > 1``.
    """

    inner: str
    store: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    want_scores: bool = False
    values: str = "softmax"
    window: int = 1
    decoding: bool = False
    last_key_mask: torch.Tensor | None = None
    window_mask: torch.Tensor | None = None
    earlier_queries: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    window_queries: torch.Tensor | None = None

    def score(self, query: torch.Tensor, key: torch.Tensor, scaling: float, softcap: float | None) -> None:
        """Fill :attr:`scores` (and :attr:`window_queries`) from the layer's ``query`` ``[1, H, q, D]`` and
        every key it sees ``[1, KVH, k, D]``."""
        if self.window == 1:
            mask = None if self.last_key_mask is None else self.last_key_mask[None]
            self.scores = window_scores(query[:, :, -1:], key, scaling, mask, softcap, self.values)
            return
        if not self.decoding:
            queries = query[:, :, -self.window :]
        elif self.earlier_queries is None:
            queries = query[:, :, -1:]
        else:
            queries = torch.cat([self.earlier_queries, query[:, :, -1:]], dim=2)[:, :, -self.window :]
        self.window_queries = queries
        self.scores = window_scores(queries, key, scaling, self.window_mask, softcap, self.values)


def _inner_attention(module: torch.nn.Module, name: str) -> Any:
    if name == "eager":
        # Each modeling file has its own eager kernel (Gemma's soft-caps); use the module's.
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def _lazyllm_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shapes: query ``[B, H, q, D]``, key/value ``[B, KVH, q, D]`` (transformers' attention interface)."""
    call: AttentionCall | None = kwargs.pop(CALL_KWARG, None)
    inner = _inner_attention(module, call.inner if call is not None else "sdpa")
    if call is not None:
        if call.store is not None:
            key, value = call.store(key, value)
        if call.want_scores:
            scaling = float(kwargs.get("scaling") or query.shape[-1] ** -0.5)
            call.score(query, key, scaling, kwargs.get("softcap"))
    result: tuple[torch.Tensor, torch.Tensor | None] = inner(
        module, query, key, value, attention_mask, **kwargs
    )
    return result


AttentionInterface.register(ATTENTION_NAME, _lazyllm_attention)


def lazyllm_layers(model: Any, layers: Iterable[torch.nn.Module]) -> tuple[tuple[torch.nn.Module, ...], str]:
    """Views of ``layers`` whose attention goes through the LazyLLM wrapper, and the model's own kernel.

    Each view is a shallow copy of a decoder layer whose ``self_attn`` is a shallow copy reading a
    copied config with ``_attn_implementation = "lazyllm"``. Parameters, buffers, submodules and hooks
    are the model's own (shared, not copied); nothing of the model changes, so the views are safe to
    build and use from any thread while others use the model.
    """
    original = model.config._attn_implementation
    if original not in SUPPORTED_KERNELS:
        raise ValueError(
            f"attention implementation {original!r} is not supported; load the model with "
            "attn_implementation='sdpa' (or 'eager')"
        )
    config = copy.copy(model.config)
    config._attn_implementation_internal = ATTENTION_NAME  # this copy only (no recursion into sub-configs)
    views = []
    for layer in layers:
        attention: torch.nn.Module = copy.copy(layer.get_submodule("self_attn"))
        attention.config = config
        view = copy.copy(layer)
        view._modules = {**layer._modules, "self_attn": attention}
        views.append(view)
    return tuple(views), original


def causal_mask(
    positions: torch.Tensor, window: int | None, dtype: torch.dtype, *, explicit: bool
) -> torch.Tensor | None:
    """Mask ``[1, 1, n, n]`` for queries and keys both at sorted original ``positions`` ``[n]``.

    Returns None where sdpa's ``is_causal`` is exact (no window, or the window covers every pair) and
    ``explicit`` is False. Eager attention needs ``explicit=True``: without a mask it is not causal.
    """
    if not explicit and (window is None or int(positions[-1] - positions[0]) < window):
        return None
    return query_key_mask(positions, positions, None, window, dtype)


def query_key_mask(
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    key_active: torch.Tensor | None,
    window: int | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Mask ``[1, 1, q, k]``: query ``i`` sees key ``j`` iff the key is active, ``pos_j <= pos_i`` and,
    with a window, ``pos_i - pos_j < window``.

    Args:
        query_positions: ``[q]`` original positions of the queries.
        key_positions: ``[k]`` original positions of the keys (any order).
        key_active: ``[k]`` bool or None (all active).
    """
    q = query_positions[:, None]
    k = key_positions[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= (q - k) < window
    if key_active is not None:
        allowed &= key_active[None, :]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]
