"""TSP, the token-selective propagation of FastKV (Jo et al. 2025, "FastKV: KV Cache Compression for
Fast Long-Context Processing with Token-Selective Propagation", arXiv 2502.01068).

Every prompt token runs through layers ``0..layer``; after ``layer`` only the ``budget`` tokens that
score highest propagate to the later layers: in our terms a one-stage LazyLLM schedule with FastKV's
scoring rule. Decoding never revives a dropped token: with LazyLLM's ``frozen`` revival policy each
step sees, per layer, the prompt tokens that layer kept in the prefill (every token up to ``layer``,
the propagated ones after it). FastKV itself also keeps a separately compressed KV cache (its "KV
retention rate") for every layer; we leave KV compression out, so this is TSP alone. The last prompt
position always survives; ties drop the earlier position first.

**Rule** (:data:`RULE`, ``w8-softmax-max7-sum``): FastKV's selection, the softmax attention of the
last 8 queries summed over that window, max-pooled with kernel 7 along the sequence and summed over
heads. ``tsp-lasttoken`` keeps this project's earlier variant (the last position's softmax attention,
mean over heads) so older reports reproduce.

**Knobs**: ``layer`` = ``round(15 / 32 * L)`` (0..L-2): FastKV's TSP layer 15 of LLaMA-3.1-8B's 32 (and
19 of Mistral-Nemo's 40, the same share of depth); SmolLM2: 14. ``budget`` = ``0.2`` of the prompt
(the size knob): FastKV's TSP rate 0.2 in its LongBench runs (the first version used a fixed 2048 tokens
of far longer prompts).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from lazyllm.engine import GenerationResult, LazyLLM
from lazyllm.flops import ModelDims, prefill_flops
from lazyllm.peers.base import Knobs, Peer, TokenBudget, as_scoring, model_name, num_layers, whole
from lazyllm.schedule import Schedule
from lazyllm.scoring import Scoring
from lazyllm.text import encode_prompt

RULE = Scoring.parse("fastkv")
"""FastKV's scoring rule: last 8 queries' softmax attention, summed; max pooling kernel 7; sum over heads."""
TSP_LAYER_SHARE = 15 / 32
TSP_BUDGET = 0.2


@dataclass(frozen=True)
class TSPKnobs:
    """TSP's knobs; None = the paper default scaled to the model (see :meth:`resolve`).

    Args:
        layer: 0-based TSP layer: layers ``0..layer`` see every prompt token, later ones the propagated.
        budget: tokens propagated (:class:`TokenBudget` value).
    """

    layer: int | None = None
    budget: float | None = None

    NAMES: ClassVar[tuple[str, ...]] = ("budget", "layer")

    def __post_init__(self) -> None:
        if self.layer is not None and self.layer < 0:
            raise ValueError(f"tsp layer = {self.layer}: must be >= 0")
        if self.budget is not None:
            TokenBudget(self.budget)

    @classmethod
    def from_options(cls, options: Mapping[str, float]) -> TSPKnobs:
        """Model-independent values (names are checked by :meth:`Peer.check`)."""
        layer = options.get("layer")
        return cls(layer=None if layer is None else whole("tsp layer", layer), budget=options.get("budget"))

    def resolve(self, num_layers: int) -> tuple[int, TokenBudget]:
        """``(layer, budget)`` for a model of ``num_layers`` layers, defaults filled in and checked."""
        if num_layers < 2:
            raise ValueError(f"TSP needs a model of >= 2 layers, got {num_layers}")
        layer = (
            self.layer if self.layer is not None else min(num_layers - 2, round(TSP_LAYER_SHARE * num_layers))
        )
        if not 0 <= layer <= num_layers - 2:
            raise ValueError(
                f"tsp layer = {layer}: must be in 0..{num_layers - 2} (the last layer has no later layer)"
            )
        return layer, TokenBudget(self.budget if self.budget is not None else TSP_BUDGET)


def _tsp_engine(model: Any, schedule: Schedule, tokenizer: Any) -> LazyLLM:
    """LazyLLM with TSP's decoding rule: a token dropped in the prefill never comes back.

    That is the ``frozen`` revival policy: decoding steps see, per layer, the prompt tokens that
    layer kept in the prefill, so the layers up to the TSP layer keep every prompt token, as FastKV's
    TSP does, and the later ones only the propagated tokens.
    """
    frozen = schedule.with_revival("frozen")
    return LazyLLM(model, frozen, tokenizer=tokenizer, strict_model_name=False)


class TokenSelectivePropagation:
    """FastKV's token-selective propagation as a one-stage LazyLLM schedule with FastKV's scoring rule,
    without revival.

    Args:
        model, tokenizer: the LM (never modified).
        layer: TSP layer (0-based, ``0..L-2``); None = ``round(15/32 * L)``.
        budget: tokens propagated past ``layer`` (fraction ``<= 1`` or count ``> 1``); None = 0.2.
        scoring: how the TSP layer ranks the tokens (a :class:`~lazyllm.scoring.Scoring` or its
            spelling); None = FastKV's, :data:`RULE`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        *,
        layer: int | None = None,
        budget: float | None = None,
        scoring: Scoring | str | None = None,
    ) -> None:
        self.layer, self.budget = TSPKnobs(layer=layer, budget=budget).resolve(num_layers(model))
        self.model = model
        self.tokenizer = tokenizer
        self.scoring = RULE if scoring is None else as_scoring(scoring)

    def schedule(self, n: int) -> Schedule:
        """The one-stage schedule (with :attr:`scoring`) that propagates ``budget.count(n)`` of ``n`` tokens."""
        kept = self.budget.count(n)
        percentile = 100.0 * (n - kept) / n
        return Schedule.from_layers(
            model_name(self.model), num_layers(self.model), {self.layer: percentile}
        ).with_scoring(self.scoring)

    def generate(
        self, prompt: str | torch.Tensor | list[int], *, chat: bool | None = None, **kwargs: Any
    ) -> GenerationResult:
        """Same arguments as :meth:`LazyLLM.generate`; the schedule is built for this prompt's length."""
        t0 = time.perf_counter()
        ids = encode_prompt(self.tokenizer, prompt, chat=chat)
        engine = _tsp_engine(self.model, self.schedule(ids.shape[1]), self.tokenizer)
        setup = time.perf_counter() - t0
        result = engine.generate(ids, **kwargs)
        return dataclasses.replace(result, ttft_s=result.ttft_s + setup, total_s=result.total_s + setup)


def tsp_flops(dims: ModelDims, n: int, layer: int, kept: int, scoring: Scoring | None = None) -> float:
    """Prefill FLOPs of TSP: ``n`` tokens up to ``layer`` (which scores them by ``scoring``), ``kept`` after it."""
    counts = [n] * (layer + 1) + [kept] * (dims.num_layers - layer - 1)
    scored = [i == layer and kept < n for i in range(dims.num_layers)]
    return prefill_flops(dims, counts, scored, scoring)


def _build(model: Any, tokenizer: Any, knobs: Knobs, rule: Scoring) -> TokenSelectivePropagation:
    if not isinstance(knobs, TSPKnobs):
        raise TypeError(f"TSP needs TSPKnobs, got {type(knobs).__name__}")
    return TokenSelectivePropagation(model, tokenizer, layer=knobs.layer, budget=knobs.budget, scoring=rule)


def _same_layer(layer: int) -> int:
    return layer


def _peer(name: str, rule: Scoring, title: str, *, published: bool = True) -> Peer:
    return Peer(
        name=name,
        title=title,
        rule=rule,
        size_knob="budget",
        parse=TSPKnobs.from_options,
        build=_build,
        cost=tsp_flops,
        prune_after=_same_layer,
        published=published,
    )


PEERS = (
    _peer("tsp", RULE, "TSP of FastKV (Jo et al. 2025, arXiv 2502.01068)"),
    _peer(
        "tsp-lasttoken",
        Scoring(),
        "TSP with the last token's softmax attention (earlier reports)",
        published=False,
    ),
)
