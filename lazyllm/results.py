"""What a generation returns: its tokens, text, timing and the share of the prompt it computed
(:class:`GenerationResult`), and, when asked for, a trace of every pass (:class:`GenerationTrace`).

A lower module than :mod:`lazyllm.engine` and :mod:`lazyllm.streaming`, which both use these records,
so that neither imports the other for a type.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lazyllm.sampling import Sampling


@dataclass(frozen=True)
class PassTrace:
    """What one forward pass did, per layer (recorded only when a trace is asked for).

    Attributes:
        computed: per layer, ``[q_l]`` sorted original positions the layer computed in this pass.
        attended: per layer, ``[k_l]`` sorted original positions of the keys ``t`` attended (its
            active set ``A_l``; in a ``frozen`` decoding step ``C_l`` plus ``t``).
        scores: per layer that ranked tokens, ``[n_l]`` scores of ``A_l`` by the schedule's rule (by position).
    """

    computed: tuple[torch.Tensor, ...]
    attended: tuple[torch.Tensor, ...]
    scores: dict[int, torch.Tensor]


@dataclass(frozen=True)
class GenerationTrace:
    """Per pass (the prefill, then each decoding step), what the engine computed: for tests and analysis."""

    passes: tuple[PassTrace, ...]

    def computed_counts(self, num_positions: int) -> torch.Tensor:
        """``[layers, num_positions]`` int: how often each (layer, position) pair was computed."""
        layers = len(self.passes[0].computed)
        counts = torch.zeros(layers, num_positions, dtype=torch.long)
        for p in self.passes:
            for layer, positions in enumerate(p.computed):
                counts[layer].index_add_(0, positions.cpu(), torch.ones(positions.shape[0], dtype=torch.long))
        return counts

    def computed_pairs(self) -> set[tuple[int, int]]:
        """Every (layer, position) pair computed at least once."""
        return {(layer, int(x)) for p in self.passes for layer, pos in enumerate(p.computed) for x in pos}

    def extra_pairs_per_step(self) -> list[int]:
        """Per decoding step, (token, layer) pairs computed besides the new token's own."""
        return [sum(int(c.shape[0]) - 1 for c in p.computed) for p in self.passes[1:]]


@dataclass(frozen=True)
class GenerationResult:
    """Output of :meth:`LazyLLM.generate`.

    Attributes:
        token_ids: generated ids (stop string / EOS included as generated, text cut at a stop string).
        text: decoded generation, when a tokenizer is known.
        prompt_tokens: prompt length N.
        ttft_s: seconds from the call to the first token (prefill + choosing it); for a stream, to
            the first piece of text handed to the caller; in a batch, from the batch call's start
            (:mod:`lazyllm.batch`).
        total_s: seconds for the whole generation.
        finish_reason: "eos", "stop_string" or "length"; "cancelled" for a request of
            :func:`lazyllm.batch.generate_batch` whose ``on_token`` callback returned False.
        prompt_computed_per_layer: share of prompt tokens each layer computed by the end (paper Fig. 7).
        prompt_computed_per_step: share of (prompt token, layer) pairs computed so far, after each step.
        aux_peak_entries / aux_peak_bytes: Aux Cache high-water mark.
        revival: the schedule's revival policy, as spelled in its JSON (``"dynamic"``, ``"frozen"``,
            ``"budget:B"``).
        scoring: the schedule's scoring rule, as spelled by :class:`~lazyllm.scoring.Scoring`.
        revived_pairs: (token, layer) pairs decoding steps computed besides their new tokens.
        step_logits: ``[vocab]`` float32 logits of each step, when asked for.
        trace: what every pass computed, when asked for (``generate(..., trace=True)``).
        sampling: the decoding strategy the tokens were chosen by (greedy unless asked).
        forced_logits: ``[T, vocab]`` float32, :meth:`LazyLLM.forced_logits` along an answer given
            with the request, from the same prefill (:func:`lazyllm.batch.generate_batch` only).
    """

    token_ids: list[int]
    text: str | None
    prompt_tokens: int
    ttft_s: float
    total_s: float
    finish_reason: str
    prompt_computed_per_layer: list[float]
    prompt_computed_per_step: list[float]
    aux_peak_entries: int
    aux_peak_bytes: int
    revival: str = "dynamic"
    scoring: str = "w1-softmax-none-mean"
    revived_pairs: int = 0
    step_logits: list[torch.Tensor] = field(default_factory=list, repr=False)
    trace: GenerationTrace | None = field(default=None, repr=False)
    sampling: Sampling = field(default_factory=Sampling)
    forced_logits: torch.Tensor | None = field(default=None, repr=False)

    @property
    def prompt_computed_fraction(self) -> float:
        """Share of (prompt token, layer) pairs computed over the whole generation (paper Table 2)."""
        return self.prompt_computed_per_step[-1]

    @property
    def decode_s(self) -> float:
        """Seconds spent after the first token: ``total_s - ttft_s``."""
        return self.total_s - self.ttft_s

    @property
    def decode_ms_per_token(self) -> float | None:
        """Milliseconds per token after the first, ``(total_s - ttft_s) / (tokens - 1)``; None for one token."""
        if len(self.token_ids) < 2:
            return None
        return 1000.0 * self.decode_s / (len(self.token_ids) - 1)
