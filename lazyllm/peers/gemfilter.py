"""GemFilter (Shi et al. 2024, "Discovering the Gems in Early Layers: Accelerating Long-Context LLMs
with 1000x Input Token Reduction", arXiv 2409.17422).

Run the first ``r`` decoder layers on the whole prompt, score the prompt tokens at layer ``r``, keep
the top ``k`` in their original order, then run the whole model from layer 0 on only those tokens
(positions re-assigned ``0..k-1``, so rotary embeddings are those of the short prompt) and decode from
that with the unpruned model and its own KV cache. The filter pass counts in TTFT. The last prompt
position is the query and always survives; ties drop the earlier position first.

**Rule** (:data:`RULE`, ``w1-raw-avg5-sum``): the paper's selection, the last query's raw attention
logits ``q.k / sqrt(D)`` at layer ``r`` (before the softmax), summed over the query heads and
average-pooled along the sequence with kernel 5. ``gemfilter-lasttoken`` keeps this project's earlier
variant (the softmax attention of the last position, mean over heads) so older reports reproduce.

**Knobs**: ``r`` = ``round(13 / 32 * L)`` (1..L-1): the paper filters with the 13th layer of
LLaMA-3.1-8B-Instruct's 32 (the same index appears in FastKV's GemFilter runs); SmolLM2 (30 layers): 12.
``k`` = ``0.2`` of the prompt (the size knob): the paper selects k = 1024 tokens of far longer prompts;
on our 1k-token prompts a fixed 1024 would keep everything, so we use the share FastKV's authors keep
when they run GemFilter on LongBench (retain rates 0.1 and 0.2).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from lazyllm.engine import GenerationResult, LazyLLM, select_survivors
from lazyllm.flops import ModelDims, prefill_flops
from lazyllm.peers.base import (
    Knobs,
    Peer,
    TokenBudget,
    model_name,
    num_layers,
    whole,
)
from lazyllm.peers.base import (
    as_scoring as _as_scoring,
)
from lazyllm.schedule import Schedule
from lazyllm.scoring import Scoring
from lazyllm.text import encode_prompt
from lazyllm.timing import synchronize

RULE = Scoring.parse("gemfilter")
"""GemFilter's scoring rule: raw q.k of the last query, summed over heads, average pooling kernel 5."""
GEMFILTER_LAYER_SHARE = 13 / 32
GEMFILTER_KEEP = 0.2
# A percentile that prunes all but the last position: the filter pass stops computing prompt tokens
# after layer r (the later layers see the last position only).
_ALL_BUT_LAST = math.nextafter(100.0, 0.0)


@dataclass(frozen=True)
class GemFilterKnobs:
    """GemFilter's knobs; None = the paper default scaled to the model (see :meth:`resolve`).

    Args:
        r: filter layer, 1-based: layers ``1..r`` run on the whole prompt and layer ``r``'s attention ranks it.
        k: tokens kept (:class:`TokenBudget` value).
    """

    r: int | None = None
    k: float | None = None

    NAMES: ClassVar[tuple[str, ...]] = ("k", "r")

    def __post_init__(self) -> None:
        if self.r is not None and self.r < 1:
            raise ValueError(f"gemfilter r = {self.r}: the filter layer must be >= 1")
        if self.k is not None:
            TokenBudget(self.k)

    @classmethod
    def from_options(cls, options: Mapping[str, float]) -> GemFilterKnobs:
        """Model-independent values (names are checked by :meth:`Peer.check`)."""
        r = options.get("r")
        return cls(r=None if r is None else whole("gemfilter r", r), k=options.get("k"))

    def resolve(self, num_layers: int) -> tuple[int, TokenBudget]:
        """``(r, k)`` for a model of ``num_layers`` layers, defaults filled in and checked against depth."""
        if num_layers < 2:
            raise ValueError(f"GemFilter needs a model of >= 2 layers, got {num_layers}")
        r = (
            self.r
            if self.r is not None
            else min(num_layers - 1, max(1, round(GEMFILTER_LAYER_SHARE * num_layers)))
        )
        if not 1 <= r <= num_layers - 1:
            raise ValueError(
                f"gemfilter r = {r}: must be in 1..{num_layers - 1} for a {num_layers}-layer model"
            )
        return r, TokenBudget(self.k if self.k is not None else GEMFILTER_KEEP)


@dataclass(frozen=True)
class FilterSelection:
    """What GemFilter's filter pass chose for one prompt.

    Attributes:
        kept: ``[k]`` sorted original positions kept (the last position always among them).
        scores: ``[N]`` float32 score of each prompt token at layer ``r`` by the filter's rule.
        filter_counts: tokens each layer computed in the filter pass (``N`` up to layer ``r``, then 1).
    """

    kept: torch.Tensor
    scores: torch.Tensor
    filter_counts: tuple[int, ...]


class GemFilter:
    """GemFilter: select the prompt with the first ``r`` layers, then run the model on the selection.

    Args:
        model, tokenizer: the LM (never modified).
        r: filter layer (1-based, ``1..L-1``); None = ``round(13/32 * L)``.
        k: tokens kept (fraction ``<= 1`` or count ``> 1``); None = 0.2.
        scoring: how layer ``r`` ranks the prompt (a :class:`~lazyllm.scoring.Scoring` or its
            spelling); None = GemFilter's own, :data:`RULE`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        r: int | None = None,
        k: float | None = None,
        scoring: Scoring | str | None = None,
    ) -> None:
        layers = num_layers(model)
        self.r, self.k = GemFilterKnobs(r=r, k=k).resolve(layers)
        self.model = model
        self.tokenizer = tokenizer
        self.scoring = RULE if scoring is None else _as_scoring(scoring)
        name = model_name(model)
        filtering = Schedule.from_layers(name, layers, {self.r - 1: _ALL_BUT_LAST}).with_scoring(self.scoring)
        self._filter = LazyLLM(model, filtering, tokenizer=tokenizer)
        self._engine = LazyLLM(model, Schedule.keep_all(name, layers), tokenizer=tokenizer)

    @property
    def device(self) -> torch.device:
        return self._engine.device

    def select(self, input_ids: torch.Tensor | list[int]) -> FilterSelection:
        """Run the filter pass on ``input_ids`` ``[1, N]`` and pick the top-k positions."""
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device).reshape(1, -1)
        n = ids.shape[1]
        result = self._filter.prefill(ids, return_scores=True)
        counts = tuple(result.active_counts)
        if n == 1:  # nothing to rank: the single token is the query
            return FilterSelection(torch.zeros(1, dtype=torch.long, device=ids.device), torch.ones(1), counts)
        scores = result.scores[self.r - 1]  # [N]: every prompt token is active at layer r
        keep = select_survivors(scores, n - self.k.count(n))
        return FilterSelection(kept=keep, scores=scores, filter_counts=counts)

    def generate(
        self, prompt: str | torch.Tensor | list[int], *, chat: bool | None = None, **kwargs: Any
    ) -> GenerationResult:
        """Filter the prompt, then generate unpruned from the kept tokens; arguments as :meth:`LazyLLM.generate`.

        TTFT and total time include the filter pass; ``prompt_computed_per_*`` count the (prompt token, layer)
        pairs of both passes relative to one unpruned prefill (above 1 when little is dropped).
        """
        t0 = time.perf_counter()
        ids = encode_prompt(self.tokenizer, prompt, chat=chat).to(self.device)
        n = ids.shape[1]
        selection = self.select(ids)
        kept = ids[:, selection.kept]
        synchronize(ids.device)
        filtering = time.perf_counter() - t0
        result = self._engine.generate(kept, **kwargs)
        k = kept.shape[1]
        per_layer = [(c + k) / n for c in selection.filter_counts]
        share = sum(per_layer) / len(per_layer)
        return dataclasses.replace(
            result,
            prompt_tokens=n,
            ttft_s=result.ttft_s + filtering,
            total_s=result.total_s + filtering,
            prompt_computed_per_layer=per_layer,
            prompt_computed_per_step=[share] * len(result.prompt_computed_per_step),
        )


def gemfilter_flops(dims: ModelDims, n: int, r: int, k: int, scoring: Scoring | None = None) -> float:
    """Prefill FLOPs of GemFilter: the filter pass (``r`` layers on ``n`` tokens, the rest on the last
    one, scoring at layer ``r`` by ``scoring``) plus an unpruned prefill of ``k`` tokens."""
    layers = dims.num_layers
    filter_counts = [n] * r + [1] * (layers - r)
    scored = [i == r - 1 for i in range(layers)]
    return prefill_flops(dims, filter_counts, scored, scoring) + prefill_flops(dims, [k] * layers)


def _build(model: Any, tokenizer: Any, knobs: Knobs, rule: Scoring) -> GemFilter:
    if not isinstance(knobs, GemFilterKnobs):
        raise TypeError(f"GemFilter needs GemFilterKnobs, got {type(knobs).__name__}")
    return GemFilter(model, tokenizer, r=knobs.r, k=knobs.k, scoring=rule)


def _filter_layer(r: int) -> int:
    """GemFilter's 1-based filter layer ``r`` is the 0-based layer ``r - 1`` whose scores select."""
    return r - 1


def _peer(name: str, rule: Scoring, title: str, *, published: bool = True) -> Peer:
    return Peer(
        name=name,
        title=title,
        rule=rule,
        size_knob="k",
        parse=GemFilterKnobs.from_options,
        build=_build,
        cost=gemfilter_flops,
        prune_after=_filter_layer,
        published=published,
    )


PEERS = (
    _peer("gemfilter", RULE, "GemFilter (Shi et al. 2024, arXiv 2409.17422)"),
    _peer(
        "gemfilter-lasttoken",
        Scoring(),
        "GemFilter with the last token's softmax attention (earlier reports)",
        published=False,
    ),
)
