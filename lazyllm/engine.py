"""LazyLLM prefill: progressive per-layer token pruning, driving the model's own decoder layers.

How a prefill runs (batch size 1, prompt of ``N`` tokens at original positions ``0..N-1``):

1. Embed all tokens; compute rotary cos/sin once for all ``N`` positions (per layer type for Gemma 3).
2. For each decoder layer ``l`` with active positions ``P_l`` (sorted, ``P_0 = 0..N-1``): run the
   model's own layer on the hidden states of ``P_l`` with the cos/sin of ``P_l`` and a causal mask by
   *original* positions (query ``i`` sees key ``j`` iff ``j <= i`` and, on sliding layers,
   ``i - j < window``). Because ``P_l`` is sorted, plain causality in index space equals causality by
   position, so full-attention layers keep sdpa's ``is_causal`` fast path and no mask is built;
   sliding layers get an explicit mask only when ``P_l`` spans more than the window.
3. If the schedule prunes after layer ``l``, the attention the last position paid at layer ``l`` is
   computed from ``q_last . K^T`` inside the attention call (see :mod:`lazyllm.importance`), and the
   lowest scorers are dropped by the rounding rule of :mod:`lazyllm.schedule`. ``P_{l+1}`` is a
   subset of ``P_l`` and always holds the last position.
4. Next-token logits come from the last position's final hidden state.

The model is never modified: the attention implementation is switched to ``"lazyllm"`` (a wrapper
registered with transformers' ``AttentionInterface`` that delegates to the model's own kernel) only for
the duration of a call, and restored in ``finally``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from lazyllm.architectures import DecoderStack, PositionEmbeddings, decoder_stack
from lazyllm.importance import last_query_attention
from lazyllm.schedule import Schedule, num_pruned

ATTENTION_NAME = "lazyllm"
_CALL_KWARG = "lazyllm_call"
_SWITCH_LOCK = threading.RLock()


@dataclass
class _AttentionCall:
    """What one layer's attention call should do besides attending; filled in by the call."""

    inner: str
    want_scores: bool = False
    last_key_mask: torch.Tensor | None = None  # [K] bool: keys the last query may see (sliding windows)
    scores: torch.Tensor | None = None  # [B, K] float32, set when want_scores


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
    """Attention wrapper: the model's own kernel, plus last-query importance when asked for.

    Shapes: query ``[B, H, Q, D]``, key/value ``[B, KVH, K, D]`` (transformers' attention interface).
    """
    call: _AttentionCall | None = kwargs.pop(_CALL_KWARG, None)
    inner = _inner_attention(module, call.inner if call is not None else "sdpa")
    if call is not None and call.want_scores:
        call.scores = last_query_attention(
            query,
            key,
            float(kwargs.get("scaling") or query.shape[-1] ** -0.5),
            call.last_key_mask,
            kwargs.get("softcap"),
        )
    result: tuple[torch.Tensor, torch.Tensor | None] = inner(
        module, query, key, value, attention_mask, **kwargs
    )
    return result


AttentionInterface.register(ATTENTION_NAME, _lazyllm_attention)


@contextmanager
def lazyllm_attention(model: Any) -> Iterator[str]:
    """Route ``model``'s attention through the LazyLLM wrapper for the duration of the block.

    Yields the model's own attention implementation (the wrapper delegates to it). The previous
    setting is restored in ``finally``, so the model is never left modified.
    """
    with _SWITCH_LOCK:
        original = model.config._attn_implementation
        if original == ATTENTION_NAME:  # re-entrant use: already switched
            raise RuntimeError("lazyllm_attention is already active on this model")
        if original not in ("sdpa", "eager"):
            raise ValueError(
                f"attention implementation {original!r} is not supported; load the model with "
                "attn_implementation='sdpa' (or 'eager')"
            )
        model.config._attn_implementation = ATTENTION_NAME
        try:
            yield original
        finally:
            model.config._attn_implementation = original


def causal_mask(
    positions: torch.Tensor, window: int | None, dtype: torch.dtype, *, explicit: bool
) -> torch.Tensor | None:
    """Additive mask ``[1, 1, n, n]`` for queries and keys at sorted original ``positions`` ``[n]``.

    Returns None where sdpa's ``is_causal`` is exact (no window, or the window covers every pair) and
    ``explicit`` is False. Eager attention needs ``explicit=True``: without a mask it is not causal.
    """
    n = positions.shape[0]
    if not explicit and (window is None or int(positions[-1] - positions[0]) < window):
        return None
    q = positions[:, None]
    k = positions[None, :]
    allowed = k <= q
    if window is not None:
        allowed &= (q - k) < window
    mask = torch.zeros(n, n, dtype=dtype, device=positions.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def select_survivors(scores: torch.Tensor, n_prune: int) -> torch.Tensor:
    """Indices (sorted, into the active set) of the tokens that survive pruning.

    Args:
        scores: ``[n]`` importance of the active tokens; the last entry is the last position,
            which always survives and is not ranked.
        n_prune: how many tokens to drop, at most ``n - 1``.

    Ties prune the earlier position first (stable ascending sort).
    """
    n = scores.shape[0]
    if not 0 <= n_prune <= n - 1:
        raise ValueError(f"cannot prune {n_prune} of {n} tokens (the last position must survive)")
    keep = torch.ones(n, dtype=torch.bool, device=scores.device)
    if n_prune:
        order = torch.sort(scores[:-1], stable=True).indices
        keep[order[:n_prune]] = False
    return keep.nonzero().squeeze(1)


@dataclass(frozen=True)
class PrefillResult:
    """Output of a LazyLLM prefill.

    Attributes:
        logits: ``[1, vocab]`` float32 next-token logits.
        computed_positions: one sorted int64 tensor per layer, the original positions that layer computed.
        scores: per pruning layer, ``[n_l]`` importance of the tokens active at that layer.
    """

    logits: torch.Tensor
    computed_positions: tuple[torch.Tensor, ...]
    scores: dict[int, torch.Tensor]

    @property
    def active_counts(self) -> list[int]:
        return [int(p.shape[0]) for p in self.computed_positions]

    @property
    def computed_fraction(self) -> float:
        """Share of (token, layer) pairs computed, relative to the unpruned prefill."""
        n = self.computed_positions[0].shape[0]
        return sum(self.active_counts) / (n * len(self.computed_positions))

    def next_token(self) -> int:
        return int(self.logits[0].argmax())


class LazyLLM:
    """A loaded causal LM plus a pruning :class:`Schedule`; the model itself is never changed.

    Args:
        model: a supported ``*ForCausalLM`` (see :mod:`lazyllm.architectures`), in eval mode.
        schedule: the pruning schedule; its layer count must match the model.
        strict_model_name: also require ``schedule.model == model.config.name_or_path``.
    """

    def __init__(self, model: Any, schedule: Schedule, *, strict_model_name: bool = True) -> None:
        self.model = model
        self.stack: DecoderStack = decoder_stack(model)
        name = str(getattr(model.config, "name_or_path", "") or type(model).__name__)
        schedule.check_model(name, self.stack.num_layers, strict_name=strict_model_name)
        self.schedule = schedule

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _as_input_ids(self, input_ids: torch.Tensor | list[int]) -> torch.Tensor:
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        if ids.dim() == 1:
            ids = ids[None]
        if ids.dim() != 2 or ids.shape[0] != 1:
            raise ValueError(
                f"input_ids has shape {tuple(ids.shape)}; LazyLLM runs one sequence at a time: [1, N]"
            )
        if ids.shape[1] == 0:
            raise ValueError("input_ids is empty; give at least one token")
        return ids

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor | list[int], *, return_scores: bool = False) -> PrefillResult:
        """Run the pruned prefill of one prompt.

        Args:
            input_ids: ``[1, N]`` or ``[N]`` token ids.
            return_scores: keep the importance scores of every pruning layer in the result.
        """
        ids = self._as_input_ids(input_ids)
        stack = self.stack
        n_tokens = ids.shape[1]
        with lazyllm_attention(self.model) as inner:
            explicit = inner == "eager"
            hidden = stack.embed(ids)  # [1, N, hidden]
            positions = torch.arange(n_tokens, device=ids.device)  # [N]
            full_pe = stack.position_embeddings(hidden, positions[None])
            pe: dict[str, PositionEmbeddings] = full_pe
            masks: dict[int | None, torch.Tensor | None] = {}
            computed: list[torch.Tensor] = []
            kept_scores: dict[int, torch.Tensor] = {}
            for layer_idx, layer in enumerate(stack.layers):
                computed.append(positions)
                n_active = positions.shape[0]
                n_prune = num_pruned(self.schedule.percentiles[layer_idx], n_active)
                window = stack.windows[layer_idx]
                if window not in masks:
                    masks[window] = causal_mask(positions, window, hidden.dtype, explicit=explicit)
                last_key_mask = None
                if n_prune and window is not None and int(positions[-1] - positions[0]) >= window:
                    last_key_mask = (positions[-1] - positions) < window
                call = _AttentionCall(inner=inner, want_scores=n_prune > 0, last_key_mask=last_key_mask)
                hidden = layer(
                    hidden,
                    attention_mask=masks[window],
                    position_ids=positions[None],
                    position_embeddings=pe[stack.layer_types[layer_idx]],
                    **{_CALL_KWARG: call},
                )
                if n_prune:
                    if call.scores is None:
                        raise RuntimeError(
                            f"layer {layer_idx} did not call the attention interface; cannot score tokens"
                        )
                    scores = call.scores[0]
                    if return_scores:
                        kept_scores[layer_idx] = scores
                    keep = select_survivors(scores, n_prune)
                    hidden = hidden[:, keep]
                    positions = positions[keep]
                    pe = {t: (cos[:, keep], sin[:, keep]) for t, (cos, sin) in pe.items()}
                    masks = {}
            logits = stack.logits(hidden[:, -1:]).float()
        return PrefillResult(logits=logits, computed_positions=tuple(computed), scores=kept_scores)
