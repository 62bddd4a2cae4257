"""Which tokens survive a pruning layer: LazyLLM's attention rule, and random drop (a baseline).

A selector ranks the active tokens; the engine keeps the top ones by the schedule's rounding rule.
A new rule is one small class.
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

    def reset(self) -> None:  # noqa: B027 - optional hook, most selectors keep no state
        """Called at the start of every generation."""


class AttentionSelector(TokenSelector):
    """LazyLLM: keep the tokens the last position attends to most."""

    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return attention


class RandomSelector(TokenSelector):
    """Random token drop: same counts as the schedule, tokens chosen uniformly at random (seeded).

    The generator restarts from ``seed`` at each generation, so a rerun drops the same tokens.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)

    def reset(self) -> None:
        self._generator.manual_seed(self.seed)

    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.rand(attention.shape[0], generator=self._generator).to(attention.device)
