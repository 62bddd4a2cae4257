"""How a pruning layer scores its active tokens: the :class:`Scoring` rule a schedule carries.

A rule has five parts, applied in this order at a layer with ``n`` active tokens and ``H`` query heads:

1. **Window** (``window = w``): the queries of the last ``w`` active positions (``w = 1``: the last
   position alone, LazyLLM's rule). Each window query sees the active keys at or before its own
   position (causal, and inside its sliding window on sliding layers). The cost is a ``w x n`` score
   per head, never the full ``n x n`` attention matrix.
2. **Values** (``values``): ``softmax``, the attention probabilities of each window query, or
   ``raw``, its scaled logits ``q.k / sqrt(D)`` before the softmax. Summed over the window:
   ``[H, n]``.
3. **Pooling** along the sequence (``pool``, ``kernel``): ``none``, or ``avg``/``max`` pooling of
   each head's scores over ``kernel`` neighbouring active tokens (stride 1, ``kernel // 2`` padding:
   zeros counted by ``avg``, ignored by ``max``), as ``torch.nn.functional.avg_pool1d`` /
   ``max_pool1d`` compute it.
4. **Heads** (``heads``): ``mean``, ``sum`` or ``max`` over the ``H`` query heads: ``[n]``.
5. **Layers** (``layers``): ``layer`` ranks with the pruning layer's scores alone; ``stage``
   averages the scores of every layer since the previous pruning layer (its active set is the same),
   the pruning layer included (:class:`~lazyllm.selectors.ScoringSelector`).

The default, ``w1-softmax-none-mean`` (alias ``last``), is the rule of LazyLLM (Fu et al. 2024) and of
every version-1 and version-2 schedule file; it selects exactly the tokens the engine selected
before rules existed. Two published rules have names of their own:

* ``fastkv`` = ``w8-softmax-max7-sum``: FastKV's token-selective propagation (Jo et al. 2025, arXiv
  2502.01068): the last 8 queries' softmax attention summed over the window, max-pooled with kernel 7
  along the sequence, summed over heads.
* ``gemfilter`` = ``w1-raw-avg5-sum``: GemFilter (Shi et al. 2024, arXiv 2409.17422): the last query's
  raw ``q.k`` (pre-softmax) summed over heads, average-pooled with kernel 5.

Keys a window query may not see count as probability 0 under ``softmax`` and as :data:`lazyllm.importance.MASKED_LOGIT`
under ``raw`` (below every real logit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

VALUES = ("softmax", "raw")
POOLS = ("none", "avg", "max")
HEADS = ("mean", "sum", "max")
LAYERS = ("layer", "stage")
MAX_WINDOW = 64
"""Largest query window: the score stays a thin ``w x n`` slice of the attention."""

ALIASES: dict[str, str] = {
    "last": "w1-softmax-none-mean",
    "fastkv": "w8-softmax-max7-sum",
    "gemfilter": "w1-raw-avg5-sum",
}
"""Named rules (see the module docstring for their sources)."""


@dataclass(frozen=True)
class Scoring:
    """A token-scoring rule (see the module docstring for the exact semantics).

    Args:
        window: queries of the last ``window`` active positions, ``1..64``.
        values: ``"softmax"`` (attention probabilities) or ``"raw"`` (scaled ``q.k`` logits).
        pool: ``"none"``, ``"avg"`` or ``"max"`` pooling along the sequence.
        kernel: pooling kernel, odd and ``>= 3`` with a pool, ``1`` without.
        heads: ``"mean"``, ``"sum"`` or ``"max"`` over query heads.
        layers: ``"layer"`` (the pruning layer alone) or ``"stage"`` (mean since the previous stage).

    >>> str(Scoring.parse("fastkv"))
    'w8-softmax-max7-sum'
    >>> Scoring.parse("w4-raw-none-max-stage")
    Scoring(window=4, values='raw', pool='none', kernel=1, heads='max', layers='stage')
    >>> Scoring().is_default
    True
    """

    window: int = 1
    values: str = "softmax"
    pool: str = "none"
    kernel: int = 1
    heads: str = "mean"
    layers: str = "layer"

    def __post_init__(self) -> None:
        w = self.window
        if isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_WINDOW:
            raise ValueError(
                f"scoring window = {w!r}: must be an integer in 1..{MAX_WINDOW} (query positions)"
            )
        for name, choices in (("values", VALUES), ("pool", POOLS), ("heads", HEADS), ("layers", LAYERS)):
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"scoring {name} = {getattr(self, name)!r}: unknown. Available: {', '.join(choices)}"
                )
        k = self.kernel
        if isinstance(k, bool) or not isinstance(k, int):
            raise ValueError(f"scoring kernel = {k!r}: must be an integer")
        if self.pool == "none" and k != 1:
            raise ValueError(f"scoring kernel = {k}: pool 'none' takes kernel 1 (or choose pool avg/max)")
        if self.pool != "none" and (k < 3 or k % 2 == 0):
            raise ValueError(f"scoring kernel = {k}: a {self.pool} pool needs an odd kernel >= 3")

    # ---- spelling ----------------------------------------------------------------------------------
    def __str__(self) -> str:
        pool = "none" if self.pool == "none" else f"{self.pool}{self.kernel}"
        tail = "-stage" if self.layers == "stage" else ""
        return f"w{self.window}-{self.values}-{pool}-{self.heads}{tail}"

    @classmethod
    def parse(cls, text: str) -> Scoring:
        """A rule from its spelling: an alias (:data:`ALIASES`) or ``w<W>-<values>-<pool>-<heads>[-stage]``
        where ``<pool>`` is ``none``, ``avg<K>`` or ``max<K>`` (what :meth:`__str__` writes)."""
        spelled = ALIASES.get(str(text).strip(), str(text).strip())
        parts = spelled.split("-")
        fix = f"write w<W>-<softmax|raw>-<none|avg<K>|max<K>>-<mean|sum|max>[-stage] or one of {', '.join(ALIASES)}"
        if len(parts) not in (4, 5) or not parts[0].startswith("w") or not parts[0][1:].isdigit():
            raise ValueError(f"scoring = {text!r}: {fix}")
        if len(parts) == 5 and parts[4] != "stage":
            raise ValueError(f"scoring = {text!r}: the optional last part is 'stage'; {fix}")
        pool, kernel = parts[2], 1
        if pool != "none":
            name, digits = pool[:3], pool[3:]
            if name not in ("avg", "max") or not digits.isdigit():
                raise ValueError(f"scoring = {text!r}: pool {pool!r} must be none, avg<K> or max<K>")
            pool, kernel = name, int(digits)
        return cls(
            window=int(parts[0][1:]),
            values=parts[1],
            pool=pool,
            kernel=kernel,
            heads=parts[3],
            layers="stage" if len(parts) == 5 else "layer",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "values": self.values,
            "pool": self.pool,
            "kernel": self.kernel,
            "heads": self.heads,
            "layers": self.layers,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Scoring:
        names = set(cls().to_dict())
        if not isinstance(data, Mapping) or set(data) - names:
            raise ValueError(f"scoring = {data!r}: must be an object with keys from {sorted(names)}")
        return cls(**dict(data))

    @property
    def is_default(self) -> bool:
        """Whether this is LazyLLM's own rule (last position, softmax, no pooling, mean over heads)."""
        return self == Scoring()

    @property
    def averages_layers(self) -> bool:
        return self.layers == "stage"

    # ---- from per-head scores to one score per token -----------------------------------------------
    def token_scores(self, per_head: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor:
        """Pool and reduce the window's per-head scores to one score per active token.

        Args:
            per_head: ``[H, K]`` float32 window scores (step 2 of the module docstring) in key order.
            order: ``[n]`` indices into ``K`` of the active tokens in position order (None: ``K`` is
                already that order).

        Returns:
            ``[n]`` float32 scores in position order. Without pooling the heads are reduced before
            ``order`` is applied, so the default rule gives the engine's historic values bit for bit.
        """
        if self.pool == "none":
            reduced = self._reduce_heads(per_head)
            return reduced if order is None else reduced[order]
        ordered = per_head if order is None else per_head[:, order]  # [H, n]
        pad = self.kernel // 2
        if self.pool == "avg":
            pooled = F.avg_pool1d(ordered[:, None], self.kernel, stride=1, padding=pad)[:, 0]
        else:
            pooled = F.max_pool1d(ordered[:, None], self.kernel, stride=1, padding=pad)[:, 0]
        return self._reduce_heads(pooled)

    def _reduce_heads(self, per_head: torch.Tensor) -> torch.Tensor:
        if self.heads == "mean":
            return per_head.mean(dim=0)
        if self.heads == "sum":
            return per_head.sum(dim=0)
        return per_head.amax(dim=0)

    def score_flops(self, heads: int, head_dim: int, n: int) -> float:
        """FLOPs of scoring ``n`` tokens at one layer: ``w`` window queries times ``n`` keys per head
        (one multiply-add = 2 FLOPs); softmax, pooling and reductions are left out as elsewhere."""
        return 2.0 * heads * head_dim * n * min(self.window, max(n, 1))


def scored_layers(scoring: Scoring, pruning: list[bool]) -> list[bool]:
    """Which layers compute scores: the pruning layers, and under ``layers = stage`` every layer up to
    the last pruning layer (each stage averages the layers since the previous one).

    >>> scored_layers(Scoring(layers="stage"), [False, True, False, True, False])
    [True, True, True, True, False]
    """
    if not scoring.averages_layers or not any(pruning):
        return list(pruning)
    last = max(i for i, p in enumerate(pruning) if p)
    return [i <= last for i in range(len(pruning))]
