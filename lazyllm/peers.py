"""Peer methods a practitioner would pick today, behind LazyLLM's ``generate`` API.

* **GemFilter** (Shi et al. 2024, arXiv 2409.17422; :class:`GemFilter`): run the first ``r`` decoder
  layers on the whole prompt, rank the prompt tokens by the attention the last position pays them at
  layer ``r`` (softmax over the prompt, mean over query heads), keep the top ``k`` in their original
  order, then run the whole model from layer 0 on only those tokens (positions re-assigned
  ``0..k-1``, so rotary embeddings are those of the short prompt) and decode from that with the
  unpruned model and its own KV cache. The filter pass counts in TTFT.
* **TSP**, FastKV's token-selective propagation (Jo et al. 2025, arXiv 2502.01068;
  :class:`TokenSelectivePropagation`): every prompt token runs through layers ``0..layer``; after
  ``layer`` only the ``budget`` tokens the last position attends to most propagate to the later layers.
  In our terms a one-stage LazyLLM schedule. Decoding never revives a dropped token: with LazyLLM's
  ``frozen`` revival policy each step sees, per layer, the prompt tokens that layer kept in the
  prefill (every token up to ``layer``, the propagated ones after it). FastKV itself also keeps a
  separately compressed KV cache (its "KV retention rate") for every layer; we leave KV compression
  out, so this is TSP alone.

The last prompt position is the query of both selections and always survives; ties drop the earlier
position first (LazyLLM's rounding rule, :func:`lazyllm.engine.select_survivors`).

**Knobs** (``options`` of :func:`lazyllm.methods.make_method`; a token budget ``<= 1`` is a fraction
of the prompt, ``> 1`` a whole number of tokens):

=========  ===========================================================================================
knob       default (scaled to the model's depth ``L``) and its source
=========  ===========================================================================================
``r``      ``round(13 / 32 * L)`` (1..L-1): GemFilter filters with the 13th layer of
           LLaMA-3.1-8B-Instruct's 32 (Shi et al. 2024; the same index appears in FastKV's GemFilter
           runs). SmolLM2 (30 layers): 12.
``k``      ``0.2`` of the prompt: Shi et al. select k = 1024 tokens (their recommended setting, e.g.
           of 32k-token needle prompts; 2048 in some comparisons); on our 1k-token prompts a fixed
           1024 would keep everything, so we use the share FastKV's authors keep when they run
           GemFilter on LongBench (retain rates 0.1 and 0.2, their ``scripts2/longbench_gemfilter.sh``).
``layer``  ``round(15 / 32 * L)`` (0..L-2): FastKV's TSP layer 15 of LLaMA-3.1-8B's 32 (and 19 of
           Mistral-Nemo's 40, the same share of depth) (Jo et al. 2025). SmolLM2: 14.
``budget`` ``0.2`` of the prompt: FastKV's TSP rate 0.2 (its LongBench runs; the first version used a
           fixed 2048 tokens of far longer prompts).
=========  ===========================================================================================

The FLOP model (:func:`peer_flop_speedup`, :func:`match_speedup`) extends :mod:`lazyllm.flops` to
both methods so a knob can be set to a target speedup.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from lazyllm.engine import GenerationResult, LazyLLM, select_survivors
from lazyllm.flops import ModelDims, prefill_flops
from lazyllm.schedule import Schedule, num_pruned
from lazyllm.text import encode_prompt
from lazyllm.timing import synchronize

# Paper defaults as shares of depth (see the module docstring for the sources).
GEMFILTER_LAYER_SHARE = 13 / 32
GEMFILTER_KEEP = 0.2
TSP_LAYER_SHARE = 15 / 32
TSP_BUDGET = 0.2
# A percentile that prunes all but the last position: the filter pass stops computing prompt tokens
# after layer r (the later layers see the last position only).
_ALL_BUT_LAST = math.nextafter(100.0, 0.0)


def _model_name(model: Any) -> str:
    return str(getattr(model.config, "name_or_path", "") or type(model).__name__)


def _num_layers(model: Any) -> int:
    return int(model.config.num_hidden_layers)


@dataclass(frozen=True)
class TokenBudget:
    """How many prompt tokens a method keeps: a fraction of the prompt (``0 < value <= 1``) or a
    whole number of tokens (``value > 1``).

    >>> TokenBudget(0.3).count(10), TokenBudget(4).count(10), TokenBudget(40).count(10)
    (3, 4, 10)
    """

    value: float

    def __post_init__(self) -> None:
        v = self.value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"token budget = {v!r}: must be a fraction in (0, 1] or a token count > 1")
        if v > 1 and v != int(v):
            raise ValueError(f"token budget = {v!r}: a budget above 1 is a token count; give a whole number")

    @property
    def is_fraction(self) -> bool:
        return self.value <= 1

    def count(self, n: int) -> int:
        """Tokens kept of an ``n``-token prompt (at least 1). A fraction follows LazyLLM's rounding rule:
        ``n - floor((1 - value) * n)``."""
        if n < 1:
            raise ValueError(f"n = {n}: must be >= 1")
        if self.is_fraction:
            return n - num_pruned(100.0 * (1.0 - self.value), n)
        return min(int(self.value), n)


def _whole(name: str, value: float) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{name} = {value!r}: must be a whole number (a layer)")
    return int(value)


def _check_names(method: str, options: Mapping[str, float], valid: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {', '.join(map(repr, unknown))} for method {method!r}. Valid: {', '.join(valid)}"
        )


@dataclass(frozen=True)
class GemFilterKnobs:
    """GemFilter's knobs; None = the paper default scaled to the model (see :meth:`resolve`).

    Args:
        r: filter layer, 1-based: layers ``1..r`` run on the whole prompt and layer ``r``'s attention ranks it.
        k: tokens kept (:class:`TokenBudget` value).
    """

    r: int | None = None
    k: float | None = None

    NAMES = ("k", "r")

    def __post_init__(self) -> None:
        if self.r is not None and self.r < 1:
            raise ValueError(f"gemfilter r = {self.r}: the filter layer must be >= 1")
        if self.k is not None:
            TokenBudget(self.k)

    @classmethod
    def from_options(cls, options: Mapping[str, float]) -> GemFilterKnobs:
        """Validate option names and model-independent values (before any model is loaded)."""
        _check_names("gemfilter", options, cls.NAMES)
        r = options.get("r")
        return cls(r=None if r is None else _whole("gemfilter r", r), k=options.get("k"))

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
class TSPKnobs:
    """TSP's knobs; None = the paper default scaled to the model (see :meth:`resolve`).

    Args:
        layer: 0-based TSP layer: layers ``0..layer`` see every prompt token, later ones the propagated.
        budget: tokens propagated (:class:`TokenBudget` value).
    """

    layer: int | None = None
    budget: float | None = None

    NAMES = ("budget", "layer")

    def __post_init__(self) -> None:
        if self.layer is not None and self.layer < 0:
            raise ValueError(f"tsp layer = {self.layer}: must be >= 0")
        if self.budget is not None:
            TokenBudget(self.budget)

    @classmethod
    def from_options(cls, options: Mapping[str, float]) -> TSPKnobs:
        """Validate option names and model-independent values (before any model is loaded)."""
        _check_names("tsp", options, cls.NAMES)
        layer = options.get("layer")
        return cls(layer=None if layer is None else _whole("tsp layer", layer), budget=options.get("budget"))

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


# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FilterSelection:
    """What GemFilter's filter pass chose for one prompt.

    Attributes:
        kept: ``[k]`` sorted original positions kept (the last position always among them).
        scores: ``[N]`` float32 attention the last position pays each prompt token at layer ``r``.
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
    """

    def __init__(
        self, model: Any, tokenizer: Any = None, *, r: int | None = None, k: float | None = None
    ) -> None:
        layers = _num_layers(model)
        self.r, self.k = GemFilterKnobs(r=r, k=k).resolve(layers)
        self.model = model
        self.tokenizer = tokenizer
        name = _model_name(model)
        self._filter = LazyLLM(
            model, Schedule.from_layers(name, layers, {self.r - 1: _ALL_BUT_LAST}), tokenizer=tokenizer
        )
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
        self, prompt: str | torch.Tensor | list[int], *, chat: bool = False, **kwargs: Any
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


def _tsp_engine(model: Any, schedule: Schedule, tokenizer: Any) -> LazyLLM:
    """LazyLLM with TSP's decoding rule: a token dropped in the prefill never comes back.

    That is the ``frozen`` revival policy: decoding steps see, per layer, the prompt tokens that
    layer kept in the prefill, so the layers up to the TSP layer keep every prompt token, as FastKV's
    TSP does, and the later ones only the propagated tokens.
    """
    frozen = schedule.with_revival("frozen")
    return LazyLLM(model, frozen, tokenizer=tokenizer, strict_model_name=False)


class TokenSelectivePropagation:
    """FastKV's token-selective propagation as a one-stage LazyLLM schedule, without revival.

    Args:
        model, tokenizer: the LM (never modified).
        layer: TSP layer (0-based, ``0..L-2``); None = ``round(15/32 * L)``.
        budget: tokens propagated past ``layer`` (fraction ``<= 1`` or count ``> 1``); None = 0.2.
    """

    def __init__(
        self, model: Any, tokenizer: Any = None, *, layer: int | None = None, budget: float | None = None
    ) -> None:
        self.layer, self.budget = TSPKnobs(layer=layer, budget=budget).resolve(_num_layers(model))
        self.model = model
        self.tokenizer = tokenizer

    def schedule(self, n: int) -> Schedule:
        """The one-stage schedule that propagates exactly ``budget.count(n)`` of ``n`` prompt tokens."""
        kept = self.budget.count(n)
        percentile = 100.0 * (n - kept) / n
        return Schedule.from_layers(
            _model_name(self.model), _num_layers(self.model), {self.layer: percentile}
        )

    def generate(
        self, prompt: str | torch.Tensor | list[int], *, chat: bool = False, **kwargs: Any
    ) -> GenerationResult:
        """Same arguments as :meth:`LazyLLM.generate`; the schedule is built for this prompt's length."""
        t0 = time.perf_counter()
        ids = encode_prompt(self.tokenizer, prompt, chat=chat)
        engine = _tsp_engine(self.model, self.schedule(ids.shape[1]), self.tokenizer)
        setup = time.perf_counter() - t0
        result = engine.generate(ids, **kwargs)
        return dataclasses.replace(result, ttft_s=result.ttft_s + setup, total_s=result.total_s + setup)


# --------------------------------------------------------------------------------------------------
# FLOP model
def gemfilter_flops(dims: ModelDims, n: int, r: int, k: int) -> float:
    """Prefill FLOPs of GemFilter: the filter pass (``r`` layers on ``n`` tokens, the rest on the last
    one, scoring at layer ``r``) plus an unpruned prefill of ``k`` tokens."""
    layers = dims.num_layers
    filter_counts = [n] * r + [1] * (layers - r)
    scoring = [i == r - 1 for i in range(layers)]
    return prefill_flops(dims, filter_counts, scoring) + prefill_flops(dims, [k] * layers)


def tsp_flops(dims: ModelDims, n: int, layer: int, kept: int) -> float:
    """Prefill FLOPs of TSP: ``n`` tokens up to ``layer`` (which scores them), ``kept`` after it."""
    counts = [n] * (layer + 1) + [kept] * (dims.num_layers - layer - 1)
    return prefill_flops(dims, counts, [i == layer and kept < n for i in range(dims.num_layers)])


PEER_METHODS = ("gemfilter", "tsp")
_SIZE_KNOB = {"gemfilter": "k", "tsp": "budget"}


def _knobs(method: str, options: Mapping[str, float], layers: int) -> tuple[int, TokenBudget]:
    if method == "gemfilter":
        return GemFilterKnobs.from_options(options).resolve(layers)
    if method == "tsp":
        return TSPKnobs.from_options(options).resolve(layers)
    raise ValueError(f"Unknown peer method {method!r}. Available: {', '.join(PEER_METHODS)}")


def peer_flop_speedup(
    method: str, dims: ModelDims, n: int, options: Mapping[str, float] | None = None
) -> float:
    """Theoretical prefill speedup of ``method`` (``gemfilter`` or ``tsp``) over the unpruned model for an
    ``n``-token prompt, at the knobs ``options`` (defaults for the rest)."""
    layer, budget = _knobs(method, options or {}, dims.num_layers)
    kept = budget.count(n)
    base = prefill_flops(dims, [n] * dims.num_layers)
    cost = gemfilter_flops(dims, n, layer, kept) if method == "gemfilter" else tsp_flops(dims, n, layer, kept)
    return base / cost


def match_speedup(
    method: str, dims: ModelDims, n: int, target: float, options: Mapping[str, float] | None = None
) -> dict[str, float] | None:
    """The options that make ``method``'s FLOP speedup at ``n`` tokens reach ``target`` while keeping the
    most tokens: the size knob (GemFilter ``k``, TSP ``budget``) as a fraction of the prompt, the other
    knobs as given (or default). None if even one kept token cannot reach ``target``.

    The speedup falls as more tokens are kept, so the largest kept count with speedup >= target is
    found by bisection over ``1..n``.
    """
    if target <= 0 or not math.isfinite(target):
        raise ValueError(f"target speedup = {target}: must be a positive number")
    fixed = {k: v for k, v in (options or {}).items() if k != _SIZE_KNOB.get(method)}
    _knobs(method, fixed, dims.num_layers)  # validate names and the fixed knobs

    def speedup(kept: int) -> float:
        return peer_flop_speedup(method, dims, n, {**fixed, _SIZE_KNOB[method]: kept / n})

    if speedup(1) < target:
        return None
    lo, hi = 1, n  # speedup(lo) >= target
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if speedup(mid) >= target:
            lo = mid
        else:
            hi = mid - 1
    return {**fixed, _SIZE_KNOB[method]: lo / n}
