"""A FLOP model of prefill: the theoretical speedup of a schedule at a given prompt length.

Per decoder layer with ``n`` active tokens (one multiply-add = 2 FLOPs):

* linear parts scale with active tokens: ``2 n (d*H*D + 2 d*KVH*D + H*D*d + 3 d*I)`` for the q, k, v, o
  projections and the gated MLP (``d`` hidden size, ``I`` intermediate size, ``H``/``KVH`` query and
  key/value heads of size ``D``);
* attention scales with (active query, active key) pairs: ``4 H D * pairs`` (scores and weighted sum),
  ``pairs = n (n + 1) / 2`` under causality; on a sliding layer each query sees at most the active keys
  of its window, estimated as ``window * n / N`` at uniform density;
* a layer that scores its tokens (a pruning layer; under a ``stage`` rule every layer of a stage)
  computes ``w`` window queries against its ``n`` keys: ``2 H D n w`` (:meth:`Scoring.score_flops`;
  ``w = 1`` for the default rule). Pooling and head reductions are ``O(H n k)`` and left out.

The LM head runs on the last position only, the same with and without pruning. Norms, rotary
embeddings and softmax are left out (they are a few percent and scale like the linear parts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lazyllm.architectures import layer_windows
from lazyllm.schedule import Schedule, num_pruned
from lazyllm.scoring import Scoring, scored_layers


@dataclass(frozen=True)
class ModelDims:
    """The sizes the FLOP model needs, read from a transformers config by :meth:`from_config`."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    windows: tuple[int | None, ...]

    def __post_init__(self) -> None:
        for name in ("hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be >= 1")
        if not self.windows:
            raise ValueError("windows is empty: need one entry per layer")

    @property
    def num_layers(self) -> int:
        return len(self.windows)

    @classmethod
    def from_config(cls, config: Any) -> ModelDims:
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        _, windows = layer_windows(config, layers)
        return cls(
            hidden=int(config.hidden_size),
            intermediate=int(config.intermediate_size),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            vocab=int(config.vocab_size),
            windows=windows,
        )


def _pairs(n: int, n_prompt: int, window: int | None) -> float:
    """Causal (query, key) pairs among ``n`` active tokens of an ``n_prompt``-token prompt."""
    if window is None or window >= n_prompt:
        return n * (n + 1) / 2
    m = max(1.0, window * n / n_prompt)  # active keys inside one window, at uniform density
    if m >= n:
        return n * (n + 1) / 2
    return m * (m + 1) / 2 + (n - m) * m


def prefill_flops(
    dims: ModelDims, counts: list[int], pruning: list[bool] | None = None, scoring: Scoring | None = None
) -> float:
    """FLOPs of a prefill where layer ``l`` computes ``counts[l]`` tokens (``counts[0]`` = prompt length)
    and the layers flagged in ``pruning`` score theirs by ``scoring`` (default: the last position)."""
    if len(counts) != dims.num_layers:
        raise ValueError(f"counts has {len(counts)} entries, the model has {dims.num_layers} layers")
    d, hd = dims.hidden, dims.head_dim
    per_token = 2 * (
        d * dims.heads * hd + 2 * d * dims.kv_heads * hd + dims.heads * hd * d + 3 * d * dims.intermediate
    )
    n_prompt = counts[0]
    rule = scoring or Scoring()
    total = 2.0 * d * dims.vocab  # LM head, last position only
    for layer, n in enumerate(counts):
        total += per_token * n + 4 * dims.heads * hd * _pairs(n, n_prompt, dims.windows[layer])
        if pruning is not None and pruning[layer]:
            total += rule.score_flops(dims.heads, hd, n)
    return total


def flop_speedup(schedule: Schedule, dims: ModelDims, n_tokens: int) -> float:
    """Theoretical prefill speedup of ``schedule`` over the unpruned model for an ``n_tokens`` prompt."""
    if schedule.num_layers != dims.num_layers:
        raise ValueError(f"schedule has {schedule.num_layers} layers, the model has {dims.num_layers}")
    counts = schedule.keep_counts(n_tokens)
    pruning = [num_pruned(p, n) > 0 for p, n in zip(schedule.percentiles, counts)]
    scored = scored_layers(schedule.scoring, pruning)
    baseline = prefill_flops(dims, [n_tokens] * dims.num_layers)
    return baseline / prefill_flops(dims, counts, scored, schedule.scoring)
