"""A schedule inside transformers' own ``model.generate`` and pipelines: :func:`apply`.

::

    with lazyllm.apply(model, schedule):
        inputs = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")
        out = model.generate(**inputs, max_new_tokens=32)  # [B, N + new], as always

Inside the block, every ``model.generate`` call (a ``pipeline("text-generation", model=model, ...)``'s
included) runs each prompt's pruned prefill and then decodes the batch, while transformers' own loop
does everything else: ``GenerationConfig`` and keyword options, logits processors (temperature,
top-k/p, repetition penalty...), sampling from the global RNG, EOS and ``pad_token_id`` filling of
finished rows, ``StoppingCriteria``, streamers (``put``/``end``), and the return value (a LongTensor
``[B, N + new]``, or a ``GenerateDecoderOnlyOutput`` with ``return_dict_in_generate``).

**What each forward pass computes.** ``generate`` calls the model once with the whole left-padded
prompt batch, then once per step with each row's newest token. Under :func:`apply`:

* the prompt call runs the pruned prefill of every row's unpadded tokens, each pruned by its own
  scores, as one batch (:func:`lazyllm.prefill.prefill_rows`; where the schedule does not allow it,
  one row after the other, each exactly :meth:`LazyLLM.generate`'s prefill) and returns each row's
  last-position logits;
* each step call feeds every row's new token at its own next position through
  :class:`lazyllm.batch.FrozenDecoder` (the batched ``frozen`` decoding of
  :func:`lazyllm.batch.generate_batch`: one decoder for both). A schedule whose decoding revives
  tokens (``dynamic``, ``budget:N``) decodes its rows one at a time instead, each exactly as
  :meth:`LazyLLM.generate` would, with a warning (once) that the steps are not batched.

So greedy decoding gives row by row the tokens :meth:`LazyLLM.generate` gives that prompt alone (up
to float rounding of a batched matmul), and a keep-all schedule gives plain ``generate``'s tokens;
with sampling, the draws are transformers' (``torch.manual_seed`` then ``generate``), so at batch
size 1 they equal ``LazyLLM.generate(..., seed=seed)``'s.

**Mechanism, and why not** ``custom_generate``. transformers' ``custom_generate=callable`` replaces
the decoding loop (``_sample``) while the model's forward stays the plain one: LazyLLM would have
to re-implement the whole loop (processors, stopping, streamers, padding, output classes) and chase
its changes, and a pipeline would need the callable passed on every call. Instead, :func:`apply` is
a context manager that sets two attributes on the model *instance* and deletes them in ``finally``
(restoring any the user had set): ``generate``, which checks the options (an unsupported one is a
``ValueError`` naming it), opens a per-call session and calls the class's own ``generate``; and
``forward``, which runs the pruned passes only inside such a session of this thread (a
:class:`contextvars.ContextVar`) and is the model's own forward everywhere else, with the same
signature. Weights, config, attention implementation and generation config are never touched.

Limits: no beams, ``num_return_sequences > 1``, assistant or prompt-lookup decoding, contrastive
search or DoLa, ``inputs_embeds``, ``output_attentions``/``output_hidden_states``, ``use_cache=False``,
chunked prefill, continuing from a given cache, or right padding. The ``cache`` in a
``return_dict_in_generate`` output is transformers' empty cache: the pruned stores are the engine's.
While the block is open, other threads calling ``model.generate`` also get the pruned one (their
direct ``model(...)`` calls do not); the same model cannot be applied twice at once.
"""

from __future__ import annotations

import contextvars
import functools
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from lazyllm.batch import FrozenDecoder
from lazyllm.engine import LazyLLM
from lazyllm.prefill import RowPrefill, decodes_frozen, prefill_rows
from lazyllm.schedule import Schedule
from lazyllm.text import caller_stacklevel

# generation options this path cannot honour, with the value that means "off" (None is off too)
_UNSUPPORTED_OPTIONS: dict[str, Any] = {
    "num_beams": 1,
    "num_return_sequences": 1,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "penalty_alpha": None,
    "prompt_lookup_num_tokens": None,
    "assistant_early_exit": None,
    "dola_layers": None,
    "prefill_chunk_size": None,
    "cache_implementation": None,
    "output_attentions": False,
    "output_hidden_states": False,
    "token_healing": False,
}
# keyword arguments of generate this path cannot take (any non-None value)
_UNSUPPORTED_ARGUMENTS = (
    "assistant_model",
    "custom_generate",
    "inputs_embeds",
    "cache",
    "past_key_values",
    "negative_prompt_ids",
)

_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar("lazyllm_session", default=None)
_APPLIED: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_ATTRIBUTES = ("generate", "forward")


class _Session:
    """The pruned passes of one ``generate`` call: the prefill on the first call, then decoding steps."""

    def __init__(self, engine: LazyLLM, max_new_tokens: int | None, max_length: int | None) -> None:
        self.engine = engine
        self.max_new_tokens = max_new_tokens
        self.max_length = max_length
        self.frozen = decodes_frozen(engine)
        self.decoder: FrozenDecoder | None = None
        self.rows: list[tuple[RowPrefill, int]] = []  # per row (revival): its prefill, next position

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """``[B, 1, vocab]`` float32 logits of each row's newest position."""
        input_ids = input_ids.to(self.engine.device)
        if self.decoder is None and not self.rows:
            return self._prefill(input_ids, attention_mask)[:, None]
        if input_ids.shape[1] != 1:
            raise ValueError(
                f"a decoding step got {input_ids.shape[1]} new tokens per row; lazyllm.apply needs "
                "use_cache=True (one new token per step)"
            )
        tokens = input_ids[:, 0]
        if self.decoder is not None:
            return self.decoder.step(tokens)[:, None]
        logits = []
        for b, (prefill, start) in enumerate(self.rows):
            if start >= prefill.gen.state.capacity:
                raise ValueError(
                    f"generate asked for more tokens than the {start - prefill.n} its max_new_tokens / "
                    "max_length announced; pass max_new_tokens explicitly"
                )
            logits.append(self.engine.forward_pass(prefill.gen, tokens[b].reshape(1, 1), start))
            self.rows[b] = (prefill, start + 1)
        return torch.cat(logits)[:, None]

    def _prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        lengths = _prompt_lengths(input_ids, attention_mask)
        width = input_ids.shape[1]
        # new tokens generate may ask for (transformers' default max_length is 20)
        room = self.max_new_tokens if self.max_new_tokens is not None else (self.max_length or 20) - width
        room = max(room, 1)
        prompts = [input_ids[b : b + 1, width - n :] for b, n in enumerate(lengths)]
        prefills = prefill_rows(self.engine, prompts, rooms=[0 if self.frozen else room] * len(prompts))
        if self.frozen:
            self.decoder = FrozenDecoder(self.engine, prefills, room=room)
        else:
            warnings.warn(
                f"schedule revival {self.engine.schedule.revival} revives tokens while decoding: the "
                "rows of model.generate decode one at a time; a frozen schedule decodes them as a batch",
                stacklevel=caller_stacklevel(),
            )
            self.rows = [(p, p.n) for p in prefills]
        return torch.cat([p.logits for p in prefills])


def _prompt_lengths(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[int]:
    """Each row's prompt length under a left-padding ``attention_mask`` ``[B, N]`` (None: no padding)."""
    batch, width = input_ids.shape
    if attention_mask is None:
        return [width] * batch
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, width):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)}; lazyllm.apply needs a 2D mask "
            f"of the inputs' shape {(batch, width)}"
        )
    mask = attention_mask.to(torch.long)
    lengths = mask.sum(dim=1).tolist()
    for b, n in enumerate(lengths):
        if n < 1 or not bool((mask[b, width - n :] == 1).all()):
            raise ValueError(
                f"row {b} of attention_mask is not left-padded (0s, then 1s) or is empty; encode the "
                "prompts with tokenizer(..., padding=True, padding_side='left')"
            )
    return [int(n) for n in lengths]


def _option(name: str, kwargs: dict[str, Any], config: Any, model: Any) -> Any:
    """The value ``generate`` would use for ``name``: keyword, then the given config, then the model's."""
    if name in kwargs:
        return kwargs[name]
    for source in (config, getattr(model, "generation_config", None)):
        value = getattr(source, name, None)
        if value is not None:
            return value
    return None


def check_options(model: Any, kwargs: dict[str, Any], config: Any = None) -> None:
    """Refuse, by name, a ``generate`` option the pruned path cannot honour (``ValueError``);
    ``config``: the ``GenerationConfig`` given to ``generate`` (None: the model's own)."""
    for name in _UNSUPPORTED_ARGUMENTS:
        if kwargs.get(name) is not None:
            raise ValueError(f"model.generate({name}=...) is not supported under lazyllm.apply; leave it out")
    for name, off in _UNSUPPORTED_OPTIONS.items():
        value = _option(name, kwargs, config, model)
        if value is not None and value != off:
            raise ValueError(
                f"{name} = {value!r} is not supported under lazyllm.apply (greedy or sampled decoding "
                f"of one sequence per prompt); set {name}={off!r}"
            )
    if _option("use_cache", kwargs, config, model) is False:
        raise ValueError("use_cache = False is not supported under lazyllm.apply; set use_cache=True")


@contextmanager
def apply(
    model: Any,
    schedule: Schedule,
    *,
    strict_model_name: bool = True,
) -> Iterator[LazyLLM]:
    """Run ``schedule`` inside ``model.generate`` (and pipelines on ``model``) within the block.

    Yields the :class:`LazyLLM` engine the passes run through. On exit, normal or by an exception,
    the model is exactly as before (see the module docstring for the mechanism and the limits).

    Args:
        model: a supported ``*ForCausalLM`` (:mod:`lazyllm.architectures`), sdpa or eager attention.
        schedule: the pruning schedule; its layer count must match the model.
        strict_model_name: also require ``schedule.model`` to name the model (as :class:`LazyLLM`).
    """
    engine = LazyLLM(model, schedule, strict_model_name=strict_model_name)
    if model in _APPLIED:
        raise ValueError("lazyllm.apply is already active on this model; nest no second one")
    own_forward = model.forward  # the bound method transformers would call
    own_generate = model.generate
    saved = {name: model.__dict__[name] for name in _ATTRIBUTES if name in model.__dict__}

    @functools.wraps(own_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        session = _SESSION.get()
        if session is None or session.engine.model is not model:
            return own_forward(*args, **kwargs)
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            raise ValueError("lazyllm.apply needs input_ids (inputs_embeds are not supported)")
        logits = session.forward(input_ids, kwargs.get("attention_mask"))
        return CausalLMOutputWithPast(logits=logits)

    @functools.wraps(own_generate)
    def generate(*args: Any, **kwargs: Any) -> Any:
        config = args[1] if len(args) > 1 else kwargs.get("generation_config")  # generate(inputs, config)
        check_options(model, kwargs, config)
        lengths = (_option(name, kwargs, config, model) for name in ("max_new_tokens", "max_length"))
        token = _SESSION.set(_Session(engine, *lengths))
        try:
            return own_generate(*args, **kwargs)
        finally:
            _SESSION.reset(token)

    _APPLIED.add(model)
    try:
        model.__dict__["forward"] = forward
        model.__dict__["generate"] = generate
        yield engine
    finally:
        for name in _ATTRIBUTES:
            model.__dict__.pop(name, None)
        model.__dict__.update(saved)
        _APPLIED.discard(model)
