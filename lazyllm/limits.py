"""How long a prompt may be: one rule for every entry point (the engine, the OpenAI server, the MLflow
model).

A generation of ``max_new_tokens`` after a prompt of ``N`` tokens needs ``N + max_new_tokens``
positions, so the model's context ``C`` (``max_position_embeddings``) allows at most
``C - max_new_tokens`` prompt tokens; a server may cap prompts lower (``--max-prompt-tokens``). A
limit below :data:`MIN_PROMPT_TOKENS` leaves no room for any prompt and is an error naming where the
limit comes from.

>>> prompt_limit(4096, 96).tokens, prompt_limit(4096, 96, cap=1000).reason
(4000, '--max-prompt-tokens 1000')
>>> prompt_limit(100, 100)
Traceback (most recent call last):
...
ValueError: max_tokens = 100 leaves no room for a prompt (the model's 100-token context minus max_tokens 100)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

MIN_PROMPT_TOKENS = 1
"""The shortest prompt there must be room for."""


@dataclass(frozen=True)
class PromptLimit:
    """The most prompt tokens a request may have, and where that limit comes from (for messages).

    Attributes:
        tokens: the limit (``sys.maxsize`` when nothing limits it).
        reason: e.g. ``"the model's 4096-token context minus max_tokens 96"`` or ``"--max-prompt-tokens 300"``.
    """

    tokens: int
    reason: str

    @property
    def from_context(self) -> bool:
        """Whether the context (not a cap) sets the limit: fewer new tokens would then allow more."""
        return "context" in self.reason


def context_length(model: Any) -> int | None:
    """The model's context in tokens (``config.max_position_embeddings``; None if it names none)."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(context) if context else None


def prompt_limit(
    context: int | None, max_new_tokens: int, cap: int | None = None, *, name: str = "max_tokens"
) -> PromptLimit:
    """The prompt limit for ``max_new_tokens`` new tokens in a ``context``-token model (None: no
    context limit) under an optional ``cap``; ``ValueError`` when it is below :data:`MIN_PROMPT_TOKENS`
    (``name``: how the caller spells ``max_new_tokens`` in the message)."""
    if context is not None and (cap is None or context - max_new_tokens < cap):
        limit = PromptLimit(
            context - max_new_tokens, f"the model's {context}-token context minus {name} {max_new_tokens}"
        )
    elif cap is None:
        limit = PromptLimit(sys.maxsize, "no limit")
    else:
        limit = PromptLimit(cap, f"--max-prompt-tokens {cap}")
    if limit.tokens < MIN_PROMPT_TOKENS:
        raise ValueError(f"{name} = {max_new_tokens} leaves no room for a prompt ({limit.reason})")
    return limit
