"""Does a prompt budget fit a model's context? Pure checks on numbers, used before anything is written
(:mod:`tuner.orchestration.preflight`, from the model's config on disk) and once the model loads
(:class:`tuner.evaluation.runner.Evaluator`)."""

from __future__ import annotations

from typing import Any


def check_context(max_prompt_tokens: int, max_new_tokens: int | None, context: int | None) -> None:
    """``max_prompt_tokens`` fits the model's ``context`` (``max_position_embeddings``) with
    ``max_new_tokens`` more; a longer setting would be recorded as the study's while every prompt is
    cut to what fits. ``context`` None: the model does not say, nothing to check."""
    if context is None:
        return
    room = context - (max_new_tokens or 0)
    if max_prompt_tokens > room:
        raise ValueError(
            f"max_prompt_tokens = {max_prompt_tokens}: above what the model's {context}-token context holds "
            f"with {max_new_tokens or 0} new tokens ({room}); pass --max-prompt-tokens {room} or less"
        )


def model_context(config: Any) -> int | None:
    """A transformers config's context length (``max_position_embeddings``; None if it has none)."""
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
