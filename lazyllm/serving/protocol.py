"""OpenAI's HTTP API for the engine: request bodies checked into typed records, and response shapes.

One implementation for every server of this project: ``python -m lazyllm.serve`` (FastAPI,
``/v1/chat/completions`` and ``/v1/completions``) and the MLflow pyfunc model
(:mod:`tuner.tracking.serving`, ``/invocations``) check bodies with :func:`check_chat_request` and
:func:`check_completion_request` and build their answers with the functions below.

Fields, as OpenAI names and means them (a field set to ``null`` takes its default):

* ``max_tokens`` (chat also ``max_completion_tokens``): at most this many new tokens, >= 1;
* ``temperature`` (default 1.0, which samples; 0 is greedy), ``top_p``, ``seed``, ``stop`` (a string
  or a list of them); ``n`` must be 1;
* ``stream`` and ``stream_options`` (``include_usage``: a last chunk with ``choices: []`` and ``usage``);
* ``model``: checked against the served names where the server gives them (404 otherwise), ignored
  by the pyfunc model; ``user``: ignored;
* extensions, passed through the client's extra body as vLLM takes them: ``top_k`` (off unless
  asked: OpenAI has none), ``repetition_penalty``, and, where the server offers several schedules,
  ``schedule`` (a name; the default is the server's first);
* OpenAI fields this engine does not implement are accepted only at the value that means "off"
  (``presence_penalty: 0``, ``logprobs: false``, ...); any other field is a 400 naming it.

A refused request is an :class:`APIError`: OpenAI's error object ``{"error": {"message", "type",
"param", "code"}}`` with its HTTP status. It is a ``ValueError``, so callers that only know Python
errors (the pyfunc model) still see a one-line reason.

Answers carry ``usage`` and a ``lazyllm`` object (:func:`lazyllm_fields`): the schedule's share of
prompt (token, layer) pairs computed, its revival and scoring, and the server's timing.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lazyllm.sampling import Sampling
from lazyllm.text import check_messages

if TYPE_CHECKING:
    from lazyllm.results import GenerationResult

FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "length": "length"}
"""The engine's finish reasons as OpenAI spells them."""


class APIError(ValueError):
    """A request refused, as OpenAI's error object with the HTTP status that goes with it.

    Args:
        message: one line naming the problem and the fix.
        status: HTTP status (400 bad request, 404 unknown model, 413 body too large, 429 busy).
        param: the request field at fault, if one is.
        code: OpenAI's machine-readable code (``context_length_exceeded``, ``model_not_found``, ...).
        kind: OpenAI's ``type`` (``invalid_request_error`` unless the server is at fault).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``, as OpenAI answers."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Decoding:
    """What to generate for one request, checked (the part chat and text completions share).

    Attributes:
        max_tokens: at most this many new tokens.
        sampling: the decoding strategy (``temperature`` 0: greedy).
        stop: stop strings (the text is cut before the first one).
        stream: answer as server-sent events.
        include_usage: with ``stream``, a last chunk with ``choices: []`` and ``usage``.
        schedule: the schedule asked for by name (None: the server's default).
    """

    max_tokens: int
    sampling: Sampling
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    schedule: str | None = None


@dataclass(frozen=True)
class ChatRequest:
    """A ``/v1/chat/completions`` body, checked: the conversation (as the chat template takes it)."""

    messages: tuple[dict[str, str], ...]
    decoding: Decoding


@dataclass(frozen=True)
class CompletionRequest:
    """A ``/v1/completions`` body, checked: the raw prompt text (no chat template)."""

    prompt: str
    decoding: Decoding


_COMMON = ("model", "user", "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed",
           "stop", "n", "stream", "stream_options")  # fmt: skip
CHAT_FIELDS = ("messages", "max_completion_tokens", *_COMMON)
COMPLETION_FIELDS = ("prompt", *_COMMON)
# OpenAI fields accepted only at the value that means "off"
_CHAT_OFF: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "logit_bias": ({},),
}
_COMPLETION_OFF: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logprobs": (0,),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "logit_bias": ({},),
}


def _number(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise APIError(f"{name} = {value!r}: must be a number", param=name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int | None, low: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise APIError(f"{name} = {value!r}: must be an integer >= {low}", param=name)
    return value


def _fields(
    body: Any, allowed: tuple[str, ...], off: Mapping[str, tuple[Any, ...]], schedules: Collection[str] | None
) -> dict[str, Any]:
    """The body's fields (nulls dropped), every name known and every "off-only" field off."""
    if not isinstance(body, Mapping):
        raise APIError(f"the request body must be a JSON object, not {type(body).__name__}")
    fields = {k: v for k, v in body.items() if v is not None}  # null: the default, as OpenAI reads it
    known = (*allowed, "schedule") if schedules is not None else allowed
    unknown = sorted(set(fields) - set(known) - set(off))
    if unknown:
        raise APIError(f"unsupported fields {unknown}; supported: {', '.join(known)}", param=unknown[0])
    for name, values in off.items():
        if name in fields and fields[name] not in values:
            raise APIError(f"{name} = {fields[name]!r} is not supported; leave it out", param=name)
    return fields


def _model(fields: Mapping[str, Any], models: Collection[str] | None) -> None:
    if models is None:
        return
    name = fields.get("model")
    if name is None:
        raise APIError(f"model is missing; give one of: {', '.join(models)}", param="model")
    if name not in models:
        raise APIError(
            f"the model {name!r} does not exist; available: {', '.join(models)} (GET /v1/models)",
            status=404, param="model", code="model_not_found",
        )  # fmt: skip


def _decoding(fields: Mapping[str, Any], max_tokens: int, schedules: Collection[str] | None) -> Decoding:
    """The fields chat and text completions share (``max_tokens`` already resolved)."""
    if _integer(fields, "n", 1, 1) != 1:
        raise APIError(f"n = {fields['n']!r}: only one choice per request (n = 1)", param="n")
    stop = fields.get("stop", ())
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
        raise APIError(
            f"stop = {fields.get('stop')!r}: must be a non-empty string or a list of them", param="stop"
        )
    stream = fields.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(f"stream = {stream!r}: must be true or false", param="stream")
    include_usage = _stream_options(fields.get("stream_options"), stream)
    temperature = _number(fields, "temperature", 1.0)
    if not 0 <= temperature <= 2:
        raise APIError(f"temperature = {temperature}: must be in [0, 2] (0 is greedy)", param="temperature")
    try:
        sampling = Sampling(
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else 1.0,
            top_p=_number(fields, "top_p", 1.0),
            top_k=_integer(fields, "top_k", 0, 0) or 0,  # OpenAI has no top-k: off unless asked
            repetition_penalty=_number(fields, "repetition_penalty", 1.0),
            seed=_integer(fields, "seed", None, 0),
        )
    except ValueError as exc:
        raise APIError(str(exc), param=str(exc).split(" ", 1)[0]) from None
    schedule = fields.get("schedule")
    if schedule is not None and (schedules is None or schedule not in schedules):
        raise APIError(
            f"schedule = {schedule!r} is unknown; available: {', '.join(schedules or ())}",
            param="schedule", code="schedule_not_found",
        )  # fmt: skip
    return Decoding(max_tokens, sampling, tuple(stop), stream, include_usage, schedule)


def _stream_options(options: Any, stream: bool) -> bool:
    """``include_usage`` from ``stream_options`` (only with ``stream``)."""
    if options is None:
        return False
    if not stream:
        raise APIError("stream_options is only allowed with stream = true", param="stream_options")
    if not isinstance(options, Mapping) or set(options) - {"include_usage", "include_obfuscation"}:
        raise APIError(
            f"stream_options = {options!r}: only include_usage is supported", param="stream_options"
        )
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise APIError(
            f"stream_options.include_usage = {include!r}: must be true or false", param="stream_options"
        )
    return include


def check_chat_request(
    body: Any,
    *,
    default_max_tokens: int,
    models: Collection[str] | None = None,
    schedules: Collection[str] | None = None,
) -> ChatRequest:
    """A chat-completions body as a :class:`ChatRequest`; anything wrong is an :class:`APIError`.

    Args:
        body: the parsed JSON body.
        default_max_tokens: the length when the body gives none.
        models: the names ``model`` may take (None: any, unchecked).
        schedules: the names the ``schedule`` extension may take (None: the field is not offered).
    """
    fields = _fields(body, CHAT_FIELDS, _CHAT_OFF, schedules)
    _model(fields, models)
    try:
        messages = tuple(check_messages(fields.get("messages")))  # type: ignore[arg-type]
    except ValueError as exc:
        raise APIError(str(exc), param="messages") from None
    if "max_tokens" in fields and "max_completion_tokens" in fields:
        raise APIError("give max_tokens or max_completion_tokens, not both", param="max_tokens")
    length = fields.get("max_completion_tokens", fields.get("max_tokens", default_max_tokens))
    max_tokens = _integer({"max_tokens": length}, "max_tokens", None, 1)
    assert max_tokens is not None  # a default was given
    return ChatRequest(messages, _decoding(fields, max_tokens, schedules))


def check_completion_request(
    body: Any,
    *,
    default_max_tokens: int,
    models: Collection[str] | None = None,
    schedules: Collection[str] | None = None,
) -> CompletionRequest:
    """A (text) completions body as a :class:`CompletionRequest`: ``prompt`` is a string or a list of
    exactly one; the arguments are :func:`check_chat_request`'s."""
    fields = _fields(body, COMPLETION_FIELDS, _COMPLETION_OFF, schedules)
    _model(fields, models)
    prompt = fields.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise APIError(
            f"prompt = {_short(prompt)}: must be a non-empty string (one prompt per request)", param="prompt"
        )
    max_tokens = _integer(fields, "max_tokens", default_max_tokens, 1)
    assert max_tokens is not None
    return CompletionRequest(prompt, _decoding(fields, max_tokens, schedules))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ----------------------------------------------------------------------------------------------------
# Answers


@dataclass(frozen=True)
class ResponseHead:
    """What every chunk and answer of one request shares: ``id``, ``created`` and ``model``."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> ResponseHead:
        """A fresh head: ``prefix`` is ``chatcmpl`` or ``cmpl``."""
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model)

    def fields(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def usage(result: GenerationResult) -> dict[str, int]:
    """OpenAI's ``usage``: prompt and completion tokens."""
    done = len(result.token_ids)
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": done,
            "total_tokens": result.prompt_tokens + done}  # fmt: skip


def lazyllm_fields(result: GenerationResult, **more: Any) -> dict[str, Any]:
    """The ``lazyllm`` extension object: the share of prompt (token, layer) pairs computed, the
    schedule's revival and scoring, the engine's TTFT in seconds, and what the server adds."""
    return {
        "prompt_computed_fraction": result.prompt_computed_fraction,
        "revival": result.revival,
        "scoring": result.scoring,
        "ttft_s": result.ttft_s,
        **more,
    }


def chat_completion(
    head: ResponseHead, result: GenerationResult, text: str, extension: dict[str, Any]
) -> dict[str, Any]:
    """OpenAI's ``chat.completion`` for a finished generation."""
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
              "finish_reason": FINISH_REASONS[result.finish_reason]}  # fmt: skip
    return {
        **head.fields("chat.completion"),
        "choices": [choice],
        "usage": usage(result),
        "lazyllm": extension,
    }


def text_completion(
    head: ResponseHead, result: GenerationResult, text: str, extension: dict[str, Any]
) -> dict[str, Any]:
    """OpenAI's ``text_completion`` for a finished generation."""
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": FINISH_REASONS[result.finish_reason],
    }
    return {
        **head.fields("text_completion"),
        "choices": [choice],
        "usage": usage(result),
        "lazyllm": extension,
    }


@dataclass(frozen=True)
class Chunks:
    """The chunks of one streamed answer (``chat.completion.chunk`` or streamed ``text_completion``),
    all under one head; with ``include_usage`` every chunk but the last has ``"usage": null``, as
    OpenAI streams them."""

    head: ResponseHead
    chat: bool
    include_usage: bool = False

    @property
    def kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _choice(self, text: str | None, finish: str | None, first: bool) -> dict[str, Any]:
        reason = None if finish is None else FINISH_REASONS[finish]
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        delta: dict[str, str] = {} if text is None else {"content": text}
        if first:
            delta = {"role": "assistant", **delta}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        chunk = {**self.head.fields(self.kind), "choices": [choice]}
        return {**chunk, "usage": None} if self.include_usage else chunk

    def piece(self, text: str, *, first: bool = False) -> dict[str, Any]:
        """A piece of the text (the first chat chunk also carries the role)."""
        return self._chunk(self._choice(text, None, first))

    def finish(self, reason: str) -> dict[str, Any]:
        """The chunk with the finish reason (the engine's, spelled as OpenAI does) and no text."""
        return self._chunk(self._choice(None, reason, False))

    def usage(self, result: GenerationResult) -> dict[str, Any]:
        """The last chunk of a stream with ``include_usage``: ``choices: []`` and ``usage``."""
        return {**self.head.fields(self.kind), "choices": [], "usage": usage(result)}


def sse(event: Mapping[str, Any]) -> str:
    """One server-sent event: ``data: {json}`` and a blank line."""
    return f"data: {json.dumps(event)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
"""The event that ends an OpenAI stream."""
