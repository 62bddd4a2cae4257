"""Peer methods a practitioner would pick today, behind LazyLLM's ``generate`` API: one module each.

* :mod:`lazyllm.peers.gemfilter`: GemFilter (Shi et al. 2024, arXiv 2409.17422), filter the prompt
  with an early layer, then run the model on the selection; rule ``w1-raw-avg5-sum``.
* :mod:`lazyllm.peers.tsp`: TSP, FastKV's token-selective propagation (Jo et al. 2025, arXiv
  2502.01068), a one-stage pruning after a middle layer; rule ``w8-softmax-max7-sum``.

Each module registers its published configuration under the method's name (``gemfilter``, ``tsp``)
and the last-token variant this project used before scoring rules existed (``gemfilter-lasttoken``,
``tsp-lasttoken``), so earlier reports reproduce. A registered :class:`~lazyllm.peers.base.Peer`
carries its knobs, size knob, scoring rule and FLOP cost; :data:`PEERS` is the table by name. A new
peer is a new module here whose ``PEERS`` tuple is added below.

**Knobs** (``options`` of :func:`lazyllm.methods.make_method`; a token budget ``<= 1`` is a fraction
of the prompt, ``> 1`` a whole number of tokens): GemFilter ``r`` (filter layer) and ``k`` (tokens
kept, the size knob); TSP ``layer`` and ``budget`` (the size knob). Defaults and their sources are in
each module's docstring.
"""

from __future__ import annotations

from collections.abc import Mapping

from lazyllm.flops import ModelDims
from lazyllm.peers import gemfilter, tsp
from lazyllm.peers.base import Peer, TokenBudget
from lazyllm.peers.gemfilter import FilterSelection, GemFilter, GemFilterKnobs, gemfilter_flops
from lazyllm.peers.tsp import TokenSelectivePropagation, TSPKnobs, tsp_flops

PEERS: dict[str, Peer] = {p.name: p for p in (*gemfilter.PEERS, *tsp.PEERS)}
"""Every registered peer by name."""
PEER_METHODS = tuple(PEERS)

__all__ = [
    "PEERS",
    "PEER_METHODS",
    "FilterSelection",
    "GemFilter",
    "GemFilterKnobs",
    "Peer",
    "TSPKnobs",
    "TokenBudget",
    "TokenSelectivePropagation",
    "gemfilter_flops",
    "match_speedup",
    "peer",
    "peer_flop_speedup",
    "tsp_flops",
]


def peer(name: str) -> Peer:
    """The peer registered as ``name``; an unknown name lists the valid ones."""
    if name not in PEERS:
        raise ValueError(f"Unknown peer method {name!r}. Available: {', '.join(PEERS)}")
    return PEERS[name]


def peer_flop_speedup(
    method: str, dims: ModelDims, n: int, options: Mapping[str, float] | None = None
) -> float:
    """Theoretical prefill speedup of peer ``method`` for an ``n``-token prompt (:meth:`Peer.flop_speedup`)."""
    return peer(method).flop_speedup(dims, n, options)


def match_speedup(
    method: str, dims: ModelDims, n: int, target: float, options: Mapping[str, float] | None = None
) -> dict[str, float] | None:
    """The options of peer ``method`` that reach ``target`` keeping the most tokens (:meth:`Peer.match_speedup`)."""
    return peer(method).match_speedup(dims, n, target, options)
