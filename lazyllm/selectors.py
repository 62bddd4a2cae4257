"""Which tokens survive a pruning layer: the schedule's scoring rule, and random drop (a baseline).

A selector ranks the active tokens; the engine keeps the top ones by the schedule's rounding rule.
The engine hands every selector the scores of the schedule's :class:`~lazyllm.scoring.Scoring` rule
(query window, softmax or raw logits, pooling and head reduction already applied);
:class:`ScoringSelector` ranks by them, averaged over the stage's layers where the rule says so.
A new rule is one small class. A selector that keeps state across layers (a random generator, a
running sum) returns a fresh copy from :meth:`TokenSelector.begin`, so one :class:`~lazyllm.LazyLLM`
can serve several generations, and several threads, at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from lazyllm.scoring import Scoring, scored_layers


class TokenSelector(ABC):
    """Ranks the tokens active at a pruning layer; higher ranks survive."""

    @abstractmethod
    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Return ``[n]`` ranking values.

        Args:
            layer: the pruning layer.
            attention: ``[n]`` float32 score of each active token at ``layer`` by the schedule's
                :class:`~lazyllm.scoring.Scoring` rule (by default the attention the last position paid it).
            positions: ``[n]`` sorted original positions of the active tokens (the last is the newest).
        """

    def begin(self) -> TokenSelector:
        """The selector one generation uses (called at its start). Stateless selectors return
        ``self``; stateful ones a fresh instance, never shared between generations."""
        return self

    def observes(self, layer: int) -> bool:
        """Whether the engine should report the attention at ``layer`` even where nothing is pruned."""
        return False

    def observe(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> None:  # noqa: B027
        """Receives the attention at a layer :meth:`observes` asked for (same shapes as :meth:`rank`)."""


class AttentionSelector(TokenSelector):
    """LazyLLM: keep the tokens that score highest at the pruning layer (by default, that the last
    position attends to most)."""

    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return attention


class ScoringSelector(TokenSelector):
    """A schedule's :class:`~lazyllm.scoring.Scoring` rule: with ``layers = layer`` the pruning layer's
    scores (:class:`AttentionSelector`); with ``layers = stage`` their mean over every layer since the
    previous pruning layer, this one included (the active set is the same over those layers).

    Args:
        scoring: the rule.
        percentiles: the schedule's per-layer percentiles (where the stages start and end).
    """

    def __init__(self, scoring: Scoring, percentiles: tuple[float, ...]) -> None:
        self.scoring = scoring
        self.percentiles = tuple(percentiles)
        prunes = [p > 0 for p in self.percentiles]
        self._observed = tuple(scored_layers(scoring, prunes)) if scoring.averages_layers else ()
        self._sum: torch.Tensor | None = None
        self._count = 0

    def begin(self) -> TokenSelector:
        return self if not self._observed else ScoringSelector(self.scoring, self.percentiles)

    def observes(self, layer: int) -> bool:
        return bool(self._observed) and self._observed[layer]

    def observe(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> None:
        starts = layer == 0 or self.percentiles[layer - 1] > 0  # the first layer of a stage
        if starts or self._sum is None or self._sum.shape != attention.shape:
            self._sum, self._count = torch.zeros_like(attention), 0
        self._sum += attention
        self._count += 1

    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not self._observed or self._sum is None or self._sum.shape != attention.shape:
            return attention
        return self._sum / self._count


class RandomSelector(TokenSelector):
    """Random token drop: same counts as the schedule, tokens chosen uniformly at random (seeded).

    Each generation draws from a fresh generator seeded with ``seed``, so a rerun drops the same tokens.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)

    def begin(self) -> TokenSelector:
        return RandomSelector(self.seed)

    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.rand(attention.shape[0], generator=self._generator).to(attention.device)


class MeanAttentionSelector(TokenSelector):
    """Static token pruning's rule: rank by the last position's attention averaged over the first
    ``score_layers`` layers (all tokens are active there: nothing is pruned before the decision)."""

    def __init__(self, score_layers: int) -> None:
        if score_layers < 1:
            raise ValueError(f"score_layers = {score_layers}: must be >= 1")
        self.score_layers = score_layers
        self._sum: torch.Tensor | None = None

    def begin(self) -> TokenSelector:
        return MeanAttentionSelector(self.score_layers)

    def observes(self, layer: int) -> bool:
        return layer < self.score_layers

    def observe(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> None:
        if self._sum is None or self._sum.shape != attention.shape:
            self._sum = torch.zeros_like(attention)
        self._sum += attention

    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self._sum is None or self._sum.shape != attention.shape:
            raise RuntimeError("static pruning must prune at the last of its scoring layers (engine misuse)")
        return self._sum / self.score_layers
