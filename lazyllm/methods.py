"""Generation methods by name: LazyLLM and the baselines it is compared against.

A method is a factory ``(MethodRequest) -> Generator``: anything with LazyLLM's ``generate``. The
registry is a plain table; an unknown name fails with the list of valid ones. Baselines that need
a schedule are matched to its compute here, beside the baselines themselves:

- ``random``: the schedule's keep counts, random tokens (seeded).
- ``static``: prunes once after ``score_layers`` = 2 layers, keeping the share of prompt tokens that
  computes the same (token, layer) pairs as the schedule in the long-prompt limit.
- ``compression``: drops the share of prompt words that the schedule skips overall.
- ``gemfilter`` / ``tsp``: the peers of :mod:`lazyllm.peers` (GemFilter, FastKV's token-selective
  propagation) with their published scoring rules; ``gemfilter-lasttoken`` / ``tsp-lasttoken`` the
  same with the last token's softmax attention (earlier reports). They need no schedule and take
  their own knobs as ``options`` (``r``, ``k``; ``layer``, ``budget``), the papers' defaults otherwise.

Every method is a :class:`Method` record: its factory, the options it takes (validated by
:func:`check_options` before any model is loaded; an unknown name lists the valid ones), whether it
needs a schedule, and where it has one its FLOP model, size knob and scoring rule. Nothing branches on
a method's name.

>>> method_names()
['baseline', 'compression', 'gemfilter', 'gemfilter-lasttoken', 'lazyllm', 'random', 'static', 'tsp', 'tsp-lasttoken']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from lazyllm.baselines import PromptCompression, random_drop, static_pruning
from lazyllm.engine import GenerationResult, LazyLLM
from lazyllm.flops import ModelDims, flop_speedup
from lazyllm.peers import PEERS, Peer
from lazyllm.schedule import Schedule


class Generator(Protocol):
    """What every method returns: LazyLLM's ``generate`` contract."""

    def generate(
        self,
        prompt: str | torch.Tensor | list[int],
        *,
        max_new_tokens: int = ...,
        stop_strings: list[str] | tuple[str, ...] = ...,
    ) -> GenerationResult: ...


@dataclass(frozen=True)
class MethodRequest:
    """What a method factory gets.

    Args:
        model, tokenizer: from :func:`lazyllm.load_model` (the model is never modified).
        schedule: the tuned schedule the method is compared with (None for ``baseline``).
        seed: for methods that draw at random.
        options: method knobs by name (each method documents and validates its own).
    """

    model: Any
    tokenizer: Any
    schedule: Schedule | None = None
    seed: int = 0
    options: Mapping[str, float] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def require_schedule(self, method: str) -> Schedule:
        if self.schedule is None:
            raise ValueError(f"method {method!r} needs a schedule (--schedule)")
        return self.schedule

    def computed_share(self, method: str) -> float:
        """The share of prompt (token, layer) pairs the schedule computes, in the long-prompt limit."""
        schedule = self.require_schedule(method)
        return sum(schedule.keep_fractions()) / self.num_layers


MethodFactory = Callable[[MethodRequest], Generator]
OptionsCheck = Callable[[Mapping[str, float]], object]
FlopModel = Callable[[ModelDims, int, "Schedule | None", Mapping[str, float]], float]
"""``(dims, n, schedule, options)`` -> theoretical prefill speedup of a method for an ``n``-token prompt."""


@dataclass(frozen=True)
class Method:
    """A registered generation method and what it can do.

    Attributes:
        name: registry name.
        factory: builds its generator from a :class:`MethodRequest`.
        check: validates its options without a model (``ValueError``); by default it takes none.
        needs_schedule: whether it is matched to a tuned schedule.
        flops: its FLOP model, or None where it has none.
        size_knob: the option that sets how many tokens it keeps (peers), or None.
        rule: how it scores tokens, for reports (empty where it does not rank tokens by a rule).
    """

    name: str
    factory: MethodFactory
    check: OptionsCheck
    needs_schedule: bool = True
    flops: FlopModel | None = None
    size_knob: str | None = None
    rule: str = ""

    def flop_speedup(
        self, dims: ModelDims, n: int, schedule: Schedule | None, options: Mapping[str, float]
    ) -> float:
        if self.flops is None:
            raise ValueError(f"no FLOP model for method {self.name!r}")
        return self.flops(dims, n, schedule, options)


METHODS: dict[str, Method] = {}


def _no_options(name: str) -> OptionsCheck:
    def check(options: Mapping[str, float]) -> None:
        if options:
            takes = ", ".join(f"{p.name} ({', '.join(p.knob_names)})" for p in PEERS.values())
            raise ValueError(
                f"method {name!r} takes no options (got {', '.join(sorted(options))}); options are for: {takes}"
            )

    return check


def register_method(
    name: str,
    *,
    options: OptionsCheck | None = None,
    needs_schedule: bool = True,
    flops: FlopModel | None = None,
    size_knob: str | None = None,
    rule: str = "",
) -> Callable[[MethodFactory], MethodFactory]:
    """Decorator: add a factory to :data:`METHODS` under ``name`` (names are unique), with the
    :class:`Method` attributes given here (``options`` validates the knobs without a model)."""

    def add(factory: MethodFactory) -> MethodFactory:
        if name in METHODS:
            raise ValueError(f"method {name!r} is registered twice")
        METHODS[name] = Method(
            name, factory, options or _no_options(name), needs_schedule, flops, size_knob, rule
        )
        return factory

    return add


def method_names() -> list[str]:
    return sorted(METHODS)


def method(name: str) -> Method:
    """The method registered as ``name``; an unknown name lists the valid ones."""
    if name not in METHODS:
        raise ValueError(f"Unknown method {name!r}. Available: {', '.join(method_names())}")
    return METHODS[name]


def check_method(name: str) -> None:
    method(name)


def check_options(name: str, options: Mapping[str, float]) -> None:
    """Validate ``options`` for method ``name`` before any model is loaded (one-line ``ValueError``)."""
    method(name).check(options)


def needs_schedule(name: str) -> bool:
    """Whether method ``name`` needs a schedule (``baseline`` and the peers do not)."""
    return method(name).needs_schedule


def peer_names() -> list[str]:
    """The registered methods that have a size knob (the peers a matched-speed comparison tunes)."""
    return [name for name in method_names() if METHODS[name].size_knob is not None]


def parse_method_options(text: str | None) -> dict[str, dict[str, float]]:
    """``"gemfilter.k=0.3,tsp.layer=14"`` -> ``{"gemfilter": {"k": 0.3}, "tsp": {"layer": 14.0}}``,
    every method and knob validated (:func:`check_options`).

    >>> parse_method_options("gemfilter.k=0.3, gemfilter.r=12")
    {'gemfilter': {'k': 0.3, 'r': 12.0}}
    """
    out: dict[str, dict[str, float]] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, eq, value = item.partition("=")
        method, dot, knob = key.strip().partition(".")
        if not eq or not dot or not method or not knob.strip():
            raise ValueError(f"method option {item!r}: write METHOD.KNOB=VALUE, e.g. gemfilter.k=0.3")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"method option {item!r}: {value.strip()!r} is not a number") from None
        if not math.isfinite(number):
            raise ValueError(f"method option {item!r}: must be a finite number")
        knobs = out.setdefault(method, {})
        if knob.strip() in knobs:
            raise ValueError(f"method option {key.strip()!r} is given twice")
        knobs[knob.strip()] = number
    for method, knobs in out.items():
        check_options(method, knobs)
    return out


def make_method(
    name: str,
    model: Any,
    tokenizer: Any,
    schedule: Schedule | None = None,
    *,
    seed: int = 0,
    options: Mapping[str, float] | None = None,
) -> Generator:
    """A generator for method ``name`` (see :data:`METHODS`)."""
    check_options(name, options or {})
    request = MethodRequest(model, tokenizer, schedule, seed, dict(options or {}))
    return METHODS[name].factory(request)


def _unpruned_flops(
    dims: ModelDims, n: int, schedule: Schedule | None, options: Mapping[str, float]
) -> float:
    return 1.0


def _schedule_flops(
    dims: ModelDims, n: int, schedule: Schedule | None, options: Mapping[str, float]
) -> float:
    if schedule is None:
        raise ValueError("the lazyllm FLOP model needs a schedule")
    return flop_speedup(schedule, dims, n)


@register_method("baseline", needs_schedule=False, flops=_unpruned_flops)
def _baseline(req: MethodRequest) -> Generator:
    name = str(req.model.config.name_or_path)
    return LazyLLM(req.model, Schedule.keep_all(name, req.num_layers), tokenizer=req.tokenizer)


@register_method("lazyllm", flops=_schedule_flops, rule="the schedule's own (Schedule.scoring)")
def _lazyllm(req: MethodRequest) -> Generator:
    schedule = req.require_schedule("lazyllm")
    return LazyLLM(req.model, schedule, tokenizer=req.tokenizer, strict_model_name=False)


@register_method("random")
def _random(req: MethodRequest) -> Generator:
    schedule = req.require_schedule("random")
    return random_drop(req.model, schedule, tokenizer=req.tokenizer, seed=req.seed)


STATIC_SCORE_LAYERS = 2


def static_keep_share(computed: float, num_layers: int, score_layers: int = STATIC_SCORE_LAYERS) -> float:
    """The share of prompt tokens static pruning keeps after ``score_layers`` full layers so that it
    computes ``computed`` of the (token, layer) pairs: ``score_layers + keep * (L - score_layers) =
    computed * L``, clipped to [0.01, 1].

    >>> static_keep_share(0.6, 12)
    0.52
    """
    keep = (computed * num_layers - score_layers) / (num_layers - score_layers)
    return round(min(1.0, max(0.01, keep)), 12)


@register_method("static")
def _static(req: MethodRequest) -> Generator:
    keep = static_keep_share(req.computed_share("static"), req.num_layers)
    return static_pruning(req.model, keep, score_layers=STATIC_SCORE_LAYERS, tokenizer=req.tokenizer)


@register_method("compression")
def _compression(req: MethodRequest) -> Generator:
    drop = min(0.95, max(0.0, 1.0 - req.computed_share("compression")))
    return PromptCompression(req.model, req.tokenizer, drop_fraction=drop)


def _register_peer(peer: Peer) -> None:
    def factory(req: MethodRequest) -> Generator:
        generator: Generator = peer.make(req.model, req.tokenizer, req.options)
        return generator

    def flops(dims: ModelDims, n: int, schedule: Schedule | None, options: Mapping[str, float]) -> float:
        return peer.flop_speedup(dims, n, options)

    register_method(
        peer.name,
        options=peer.check,
        needs_schedule=False,
        flops=flops,
        size_knob=peer.size_knob,
        rule=peer.describe(),
    )(factory)


for _peer in PEERS.values():
    _register_peer(_peer)
