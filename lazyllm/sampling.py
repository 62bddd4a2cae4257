"""How the next token is chosen from a step's logits: greedy or sampled, with transformers' meaning.

The decoding strategy sits outside the pruning: the engine's passes (what each layer computes and
attends) depend only on the schedule and on the tokens fed so far, never on how a token was chosen.

:class:`Sampling` names its fields as :class:`transformers.GenerationConfig` does and applies them as
``model.generate`` does, with transformers' own logits processors in transformers' order:

1. ``repetition_penalty`` (if not 1.0) over the prompt and the tokens generated so far, greedy or not;
2. with ``do_sample`` only: ``temperature`` (if not 1.0), ``top_k`` (if not 0), ``top_p`` (if below 1.0);
3. greedy: the argmax; sampling: ``torch.multinomial`` over the softmax of the processed float32 logits.

The random stream is a private ``torch.Generator`` on the model's device seeded with ``seed``, so a
call is reproducible and touches no global RNG; it draws exactly as ``torch.manual_seed(seed)``
followed by ``model.generate(..., do_sample=True)`` does (one multinomial draw per token), which is
why the same seed gives the same tokens as transformers on the same logits. ``seed=None`` draws a
fresh seed per call.

The defaults are transformers' library defaults (greedy; ``top_k`` 50 once sampling is on), not a
checkpoint's ``generation_config.json``: greedy stays the engine's default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

SAMPLING_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")

# GenerationConfig fields that change how a token is chosen and that this engine does not implement,
# with the value that means "off" (None always means off too).
_UNSUPPORTED: dict[str, Any] = {
    "num_beams": 1,
    "num_return_sequences": 1,
    "min_p": None,
    "top_h": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "min_length": 0,
    "min_new_tokens": None,
    "encoder_repetition_penalty": 1.0,
    "exponential_decay_length_penalty": None,
    "guidance_scale": None,
    "watermarking_config": None,
}


@dataclass(frozen=True)
class Sampling:
    """A decoding strategy, named and applied as transformers does (see the module docstring).

    Attributes:
        do_sample: sample from the processed distribution (False: greedy, the argmax).
        temperature: divides the logits before top-k/top-p (sampling only); > 0.
        top_k: keep the ``top_k`` most likely tokens (sampling only); 0 turns it off.
        top_p: keep the smallest set of tokens whose probability reaches ``top_p`` (sampling only); in (0, 1].
        repetition_penalty: divides positive (multiplies negative) logits of tokens already in the
            sequence, prompt included; 1.0 is off; > 0. Applies to greedy decoding too.
        seed: seeds the call's own random generator (None: a fresh seed per call).

    >>> Sampling().greedy, Sampling(do_sample=True, temperature=0.7).greedy
    (True, False)
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample = {self.do_sample!r}: must be True or False")
        for name in ("temperature", "top_p", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} = {value!r}: must be a number")
            object.__setattr__(self, name, float(value))
        if not self.temperature > 0:
            raise ValueError(f"temperature = {self.temperature}: must be > 0 (do_sample=False is greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p = {self.top_p}: must be in (0, 1]")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty = {self.repetition_penalty}: must be > 0 (1.0 is off)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k = {self.top_k!r}: must be an integer >= 0 (0 is off)")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63
        ):
            raise ValueError(f"seed = {self.seed!r}: must be an integer in [0, 2**63)")

    @property
    def greedy(self) -> bool:
        """The argmax of the raw logits: no processor and no random draw (the engine's historical path)."""
        return not self.do_sample and self.repetition_penalty == 1.0

    @classmethod
    def from_generation_config(cls, config: GenerationConfig, seed: int | None = None) -> Sampling:
        """The decoding fields of a ``GenerationConfig`` (unset ones take transformers' defaults).

        Lengths and stopping (``max_new_tokens``, ``eos_token_id``, ``stop_strings``) stay arguments of
        :meth:`~lazyllm.engine.LazyLLM.generate`; a field that changes the choice of token and that this
        engine does not implement (beams, ``min_p``, ``no_repeat_ngram_size``, ...) is an error.
        """
        for name, off in _UNSUPPORTED.items():
            value = getattr(config, name, None)
            if value is not None and value != off:
                raise ValueError(
                    f"GenerationConfig.{name} = {value!r} is not supported by LazyLLM; "
                    f"supported: {', '.join(SAMPLING_FIELDS)} (and a seed)"
                )
        defaults = cls()
        values = {
            name: getattr(defaults, name) if getattr(config, name, None) is None else getattr(config, name)
            for name in SAMPLING_FIELDS
        }
        return cls(**values, seed=seed)

    @classmethod
    def resolve(cls, base: Sampling | GenerationConfig | None = None, **overrides: Any) -> Sampling:
        """``base`` (a Sampling, a GenerationConfig, or the defaults) with the non-None ``overrides`` on
        top, as ``model.generate(generation_config=..., temperature=...)`` combines them."""
        unknown = sorted(set(overrides) - {*SAMPLING_FIELDS, "seed"})
        if unknown:
            raise ValueError(f"unknown decoding options {unknown}; valid: {', '.join(SAMPLING_FIELDS)}, seed")
        if isinstance(base, GenerationConfig):
            base = cls.from_generation_config(base)
        given = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(base or cls(), **given)

    def processors(self) -> LogitsProcessorList:
        """transformers' processors for this strategy, in ``model.generate``'s order (empty when greedy)."""
        procs = LogitsProcessorList()
        if self.repetition_penalty != 1.0:
            procs.append(RepetitionPenaltyLogitsProcessor(self.repetition_penalty))
        if self.do_sample:
            if self.temperature != 1.0:
                procs.append(TemperatureLogitsWarper(self.temperature))
            if self.top_k != 0:
                procs.append(TopKLogitsWarper(top_k=self.top_k))
            if self.top_p < 1.0:
                procs.append(TopPLogitsWarper(top_p=self.top_p))
        return procs

    def picker(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> TokenPicker:
        """A fresh :class:`TokenPicker` for one generation of at most ``max_new_tokens`` after ``prompt_ids``."""
        return TokenPicker(self, prompt_ids, max_new_tokens)


class TokenPicker:
    """Chooses each next token of one generation (never shared between calls).

    Holds the sequence so far on the device (``[1, N + max_new_tokens]``, for the repetition penalty)
    and the call's random generator. :meth:`pick` returns the token as a ``[1, 1]`` device tensor, so
    the caller's single read of it is the step's only host sync.
    """

    def __init__(self, sampling: Sampling, prompt_ids: torch.Tensor, max_new_tokens: int) -> None:
        self.sampling = sampling
        self.processors = sampling.processors()
        device = prompt_ids.device
        n = prompt_ids.shape[1]
        self.length = n
        self.ids: torch.Tensor | None = None
        if self.processors:
            self.ids = torch.empty(1, n + max_new_tokens, dtype=torch.long, device=device)
            self.ids[:, :n] = prompt_ids
        self.generator: torch.Generator | None = None
        if sampling.do_sample:
            self.generator = torch.Generator(device=device)
            if sampling.seed is None:
                self.generator.seed()
            else:
                self.generator.manual_seed(sampling.seed)

    def pick(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token ``[1, 1]`` (long, on the logits' device) from ``[1, vocab]`` float32 logits."""
        scores = logits
        if self.ids is not None:
            scores = self.processors(self.ids[:, : self.length], logits)  # type: ignore[arg-type]
        if self.generator is not None:
            token = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=self.generator)
        else:
            token = scores.argmax(dim=-1, keepdim=True)
        if self.ids is not None:
            self.ids[:, self.length] = token[:, 0]
            self.length += 1
        return token
