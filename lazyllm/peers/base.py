"""What every peer method shares: the token budget, knob checks, and the :class:`Peer` record.

A peer is one small module under :mod:`lazyllm.peers` that registers :class:`Peer` records (its
published configuration, and its historic last-token variant): the knobs it takes, which knob sets
its size, its token-scoring rule and its FLOP cost are attributes of the record, so nothing
elsewhere branches on a peer's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from lazyllm.engine import GenerationResult
from lazyllm.flops import ModelDims, prefill_flops
from lazyllm.schedule import num_pruned
from lazyllm.scoring import Scoring


def model_name(model: Any) -> str:
    return str(getattr(model.config, "name_or_path", "") or type(model).__name__)


def num_layers(model: Any) -> int:
    return int(model.config.num_hidden_layers)


def as_scoring(scoring: Scoring | str) -> Scoring:
    """A rule from a :class:`Scoring` or its spelling (``"fastkv"``, ``"w1-softmax-none-mean"``, ...)."""
    return scoring if isinstance(scoring, Scoring) else Scoring.parse(scoring)


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


def whole(name: str, value: float) -> int:
    """``value`` as a layer index; a ``ValueError`` naming ``name`` unless it is a whole number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{name} = {value!r}: must be a whole number (a layer)")
    return int(value)


def check_names(method: str, options: Mapping[str, float], valid: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {', '.join(map(repr, unknown))} for method {method!r}. Valid: {', '.join(valid)}"
        )


class Knobs(Protocol):
    """A peer's knobs: validated from ``options`` without a model, resolved against a model's depth."""

    NAMES: ClassVar[tuple[str, ...]]

    def resolve(self, num_layers: int) -> tuple[int, TokenBudget]:
        """``(layer, size)``: the peer's selection layer and its token budget, defaults filled in."""
        ...


class Generates(Protocol):
    def generate(self, prompt: Any, **kwargs: Any) -> GenerationResult: ...


@dataclass(frozen=True)
class Peer:
    """A peer method as the registry holds it.

    Attributes:
        name: registry name (``gemfilter``, ``tsp``, ``gemfilter-lasttoken``, ...).
        title: the method and its source, e.g. ``"GemFilter (Shi et al. 2024, arXiv 2409.17422)"``.
        rule: the token-scoring rule it selects with.
        size_knob: the option that sets how many tokens it keeps (what matched-speed comparisons tune).
        parse: option names and values -> the knobs (``ValueError`` for a bad one, no model needed).
        build: ``(model, tokenizer, knobs, rule)`` -> a generator with LazyLLM's ``generate``.
        cost: ``(dims, n, layer, kept, rule)`` -> prefill FLOPs of an ``n``-token prompt.
        prune_after: ``(layer knob) -> 0-based layer`` after which its selection takes effect (for
            :meth:`as_stage`).
        published: whether this is the paper's own configuration (False for the last-token variants).
    """

    name: str
    title: str
    rule: Scoring
    size_knob: str
    parse: Callable[[Mapping[str, float]], Knobs]
    build: Callable[[Any, Any, Knobs, Scoring], Generates]
    cost: Callable[[ModelDims, int, int, int, Scoring], float]
    prune_after: Callable[[int], int]
    published: bool = True

    @property
    def knob_names(self) -> tuple[str, ...]:
        return self.parse({}).NAMES

    def check(self, options: Mapping[str, float]) -> Knobs:
        """Validate option names and model-independent values (before any model is loaded)."""
        check_names(self.name, options, self.parse({}).NAMES)
        return self.parse(options)

    def make(self, model: Any, tokenizer: Any, options: Mapping[str, float]) -> Generates:
        return self.build(model, tokenizer, self.check(options), self.rule)

    def flop_speedup(self, dims: ModelDims, n: int, options: Mapping[str, float] | None = None) -> float:
        """Theoretical prefill speedup over the unpruned model for an ``n``-token prompt at ``options``."""
        layer, budget = self.check(options or {}).resolve(dims.num_layers)
        base = prefill_flops(dims, [n] * dims.num_layers)
        return base / self.cost(dims, n, layer, budget.count(n), self.rule)

    def as_stage(self, num_layers: int) -> tuple[int, float]:
        """Its default configuration as one LazyLLM pruning stage: ``(layer, share kept)`` for a
        ``num_layers``-layer model (a fraction-of-prompt default budget; warm starts of a search)."""
        layer, budget = self.parse({}).resolve(num_layers)
        return self.prune_after(layer), budget.value if budget.is_fraction else 1.0

    def describe(self) -> str:
        """``"GemFilter (...): scoring w1-raw-avg5-sum"``: what a report prints for this peer."""
        return f"{self.title}: scoring {self.rule}"

    def match_speedup(
        self, dims: ModelDims, n: int, target: float, options: Mapping[str, float] | None = None
    ) -> dict[str, float] | None:
        """The options that make the FLOP speedup at ``n`` tokens reach ``target`` while keeping the most
        tokens: :attr:`size_knob` as a fraction of the prompt, the other knobs as given (or default).
        None if even one kept token cannot reach ``target``.

        The speedup falls as more tokens are kept, so the largest kept count with speedup >= target is
        found by bisection over ``1..n``.
        """
        if target <= 0 or not math.isfinite(target):
            raise ValueError(f"target speedup = {target}: must be a positive number")
        fixed = {k: v for k, v in (options or {}).items() if k != self.size_knob}
        self.check(fixed).resolve(dims.num_layers)  # validate names and the fixed knobs

        def speedup(kept: int) -> float:
            return self.flop_speedup(dims, n, {**fixed, self.size_knob: kept / n})

        if speedup(1) < target:
            return None
        lo, hi = 1, n  # speedup(lo) >= target
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if speedup(mid) >= target:
                lo = mid
            else:
                hi = mid - 1
        return {**fixed, self.size_knob: lo / n}
