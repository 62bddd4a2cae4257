"""The LazyLLM paper's baselines, each behind the same ``generate(...)`` API as :class:`LazyLLM`.

* **Random token drop** (:func:`random_drop`): the schedule's keep counts, tokens chosen uniformly at
  random (seeded) instead of by attention; pruned tokens may come back in later steps, as in LazyLLM.
* **Static token pruning** (:func:`static_pruning`): prune once, in the prefill, by the last position's
  attention averaged over the first ``score_layers`` layers (:class:`MeanAttentionSelector`); layers
  after that compute only the kept prompt tokens, and decoding steps never revive others: it is the
  engine with that selector and the ``frozen`` revival policy, no engine flag. Each decoding step's
  layer ``l`` attends what layer ``l`` computed in the prefill (all prompt tokens for the first
  ``score_layers`` layers, the kept ones after) plus the generated tokens.
* **Prompt compression** (:class:`PromptCompression`, in the style of Selective Context): score each
  prompt token's self-information ``-log p(x_i | x_<i)`` with the LM itself, group tokens into words,
  drop the least informative words until the wanted share of tokens is gone, then run the unpruned model
  on the shorter prompt. The scoring forward counts in its TTFT, as in the paper.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from lazyllm.engine import GenerationResult, LazyLLM
from lazyllm.models import model_name
from lazyllm.schedule import Schedule
from lazyllm.selectors import MeanAttentionSelector, RandomSelector
from lazyllm.text import encode_prompt
from lazyllm.timing import synchronize


def random_drop(model: Any, schedule: Schedule, *, tokenizer: Any = None, seed: int = 0) -> LazyLLM:
    """Random token drop with the same per-layer keep counts as ``schedule``."""
    return LazyLLM(model, schedule, tokenizer=tokenizer, selector=RandomSelector(seed))


def static_pruning(
    model: Any, keep_fraction: float, *, score_layers: int = 2, tokenizer: Any = None
) -> LazyLLM:
    """Static token pruning keeping ``keep_fraction`` of the prompt after the first ``score_layers`` layers."""
    layers = int(model.config.num_hidden_layers)
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction = {keep_fraction}: must be in (0, 1]")
    if not 1 <= score_layers <= layers - 1:
        raise ValueError(f"score_layers = {score_layers}: must be in 1..{layers - 1}")
    schedule = Schedule.from_layers(
        model_name(model), layers, {score_layers - 1: 100.0 * (1.0 - keep_fraction)}
    ).with_revival("frozen")
    return LazyLLM(model, schedule, tokenizer=tokenizer, selector=MeanAttentionSelector(score_layers))


class PromptCompression:
    """Selective-Context-style prompt compression with the model itself as the scorer.

    Args:
        model, tokenizer: the LM (the tokenizer tells word boundaries).
        drop_fraction: share of the compressible prompt tokens to drop, in ``[0, 1)``.
        protect_first / protect_last: tokens at the start (BOS, system text) and end (the question and
            the template's answer cue) that are never dropped.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        drop_fraction: float,
        *,
        protect_first: int = 1,
        protect_last: int = 64,
    ) -> None:
        if not 0.0 <= drop_fraction < 1.0:
            raise ValueError(f"drop_fraction = {drop_fraction}: must be in [0, 1)")
        if protect_first < 1 or protect_last < 1:
            raise ValueError("protect_first and protect_last must be >= 1 (the first token has no score)")
        self.model = model
        self.tokenizer = tokenizer
        self.drop_fraction = drop_fraction
        self.protect_first = protect_first
        self.protect_last = protect_last
        self.engine = LazyLLM(
            model,
            Schedule.keep_all(model_name(model), int(model.config.num_hidden_layers)),
            tokenizer=tokenizer,
        )

    @torch.inference_mode()
    def self_information(self, ids: torch.Tensor) -> torch.Tensor:
        """``[N]`` float32 ``-log p(x_i | x_<i)`` for ``ids`` ``[1, N]`` (0 for the first token)."""
        logits = self.model(ids).logits[0, :-1].float()  # [N-1, vocab]
        logp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
        return torch.cat([logp.new_zeros(1), -logp])

    def compress(self, ids: torch.Tensor) -> torch.Tensor:
        """The kept token ids ``[1, M]`` (order preserved) of ``ids`` ``[1, N]``."""
        n = ids.shape[1]
        lo, hi = self.protect_first, n - self.protect_last
        if hi - lo < 2 or self.drop_fraction == 0:
            return ids
        info = self.self_information(ids)
        # words: a token whose text starts with whitespace opens a new word
        starts = [lo] + [
            i for i in range(lo + 1, hi) if self.tokenizer.decode([int(ids[0, i])])[:1].isspace()
        ]
        bounds = list(zip(starts, [*starts[1:], hi]))
        word_info = [float(info[a:b].sum()) for a, b in bounds]
        target = int(self.drop_fraction * (hi - lo))
        keep = torch.ones(n, dtype=torch.bool, device=ids.device)
        dropped = 0
        for w in sorted(range(len(bounds)), key=lambda w: (word_info[w], w)):
            if dropped >= target:
                break
            a, b = bounds[w]
            keep[a:b] = False
            dropped += b - a
        return ids[:, keep]

    def generate(
        self, prompt: str | torch.Tensor | list[int], *, chat: bool | None = None, **kwargs: Any
    ) -> GenerationResult:
        """Compress the prompt, then generate unpruned; same arguments as :meth:`LazyLLM.generate`."""
        t0 = time.perf_counter()
        ids = encode_prompt(self.tokenizer, prompt, chat=chat).to(self.engine.device)
        kept = self.compress(ids)
        synchronize(ids.device)
        scoring = time.perf_counter() - t0
        result = self.engine.generate(kept, **kwargs)
        share = kept.shape[1] / ids.shape[1]
        return dataclasses.replace(
            result,
            prompt_tokens=ids.shape[1],
            ttft_s=result.ttft_s + scoring,
            total_s=result.total_s + scoring,
            prompt_computed_per_layer=[share] * len(result.prompt_computed_per_layer),
            prompt_computed_per_step=[share] * len(result.prompt_computed_per_step),
        )
