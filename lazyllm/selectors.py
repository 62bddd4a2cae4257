"""Which tokens survive a pruning layer: LazyLLM's attention rule, and random drop (a baseline).

A selector ranks the active tokens; the engine keeps the top ones by the schedule's rounding rule.
A new rule is one small class. A selector that keeps state across layers (a random generator, a
running sum) returns a fresh copy from :meth:`TokenSelector.begin`, so one :class:`~lazyllm.LazyLLM`
can serve several generations, and several threads, at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class TokenSelector(ABC):
    """Ranks the tokens active at a pruning layer; higher ranks survive."""

    @abstractmethod
    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Return ``[n]`` ranking values.

        Args:
            layer: the pruning layer.
            attention: ``[n]`` float32 attention the last position paid each active token at ``layer``.
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
    """LazyLLM: keep the tokens the last position attends to most."""

    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return attention


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
