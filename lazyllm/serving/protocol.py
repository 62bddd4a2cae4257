"""OpenAI's HTTP API for the engine: request bodies as pydantic models checked into typed records, the
error object, and the answers' shapes.

One implementation for every server of this project: ``python -m lazyllm.serve`` (FastAPI,
``/v1/chat/completions`` and ``/v1/completions``; FastAPI validates the bodies with
:class:`ChatBody` and :class:`CompletionBody`, and the app's OpenAPI schema describes them) and the
MLflow pyfunc model (:mod:`tuner.tracking.serving`, ``/invocations``) check bodies with
:func:`check_chat_request` and :func:`check_completion_request` and build their answers with the
functions below.

Fields, as OpenAI names and means them (a field set to ``null`` takes its default):

* ``max_tokens`` (chat also ``max_completion_tokens``): at most this many new tokens, >= 1;
* ``temperature`` in [0, 2] (default 1.0, which samples; 0 is greedy; a positive one below
  :data:`MIN_TEMPERATURE` is refused: divided by it, float32 logits overflow), ``top_p`` in (0, 1],
  ``seed`` in [0, 2**63), ``stop`` (a string or a list of at most :data:`MAX_STOP` strings of 1 to
  :data:`MAX_STOP_CHARS` characters); ``n`` must be 1; every number finite;
* ``stream`` and ``stream_options`` (``include_usage``: a last chunk with ``choices: []`` and ``usage``);
* ``model``: checked against the served names where the server gives them (404 otherwise), ignored
  by the pyfunc model; ``user``: ignored;
* extensions, passed through the client's extra body as vLLM takes them: ``top_k`` (>= 0; off unless
  asked: OpenAI has none), ``repetition_penalty`` (in [0.01, 100]; 1 is off), ``ignore_eos`` (decode
  on past EOS up to ``max_tokens``: load tests ask for it), and, where the server offers several
  schedules, ``schedule`` (a name; the default is the server's first); ``stream_options`` may carry
  vLLM's ``continuous_usage_stats``, accepted and ignored (``usage`` comes in the last chunk);
* OpenAI fields this engine does not implement are accepted only at the value that means "off"
  (``presence_penalty: 0``, ``logprobs: false``, ...); any other field is a 400 naming it (OpenAI
  answers an unrecognized argument with a 400 too).

Strings must be valid Unicode (a lone surrogate such as ``"\\ud800"``, in a value or a field name,
is a 400). A refused request is an :class:`APIError`: OpenAI's error object ``{"error": {"message",
"type", "param", "code"}}`` with its HTTP status. It is a ``ValueError``, so callers that only know
Python errors (the pyfunc model) still see a one-line reason.

Answers carry ``usage`` and a ``lazyllm`` object (:func:`lazyllm_fields`): the schedule's share of
prompt (token, layer) pairs computed, its revival and scoring, and the server's timing.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from lazyllm.sampling import Sampling
from lazyllm.text import check_messages

if TYPE_CHECKING:
    from lazyllm.results import GenerationResult

FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "length": "length"}
"""The engine's finish reasons as OpenAI spells them."""

MAX_STOP = 4
"""The most stop strings a request may give (OpenAI's limit)."""

MAX_STOP_CHARS = 128
"""The longest stop string, in characters (the stream holds back that many less one)."""

MIN_TEMPERATURE = 1e-5
"""The smallest positive temperature (vLLM's threshold below which sampling is greedy)."""

REPETITION_PENALTY = (0.01, 100.0)
"""The range of ``repetition_penalty`` (1 is off; outside it the penalised logits overflow or vanish)."""

ERROR_TYPE = "lazyllm_invalid_value"
"""The pydantic error type of a body refused by this module's checks (its context has ``param``)."""


class APIError(ValueError):
    """A request refused, as OpenAI's error object with the HTTP status that goes with it.

    Args:
        message: one line naming the problem and the fix.
        status: HTTP status (400 bad request, 401 no key, 404 unknown model, 413 body too large, 415
            not JSON, 429 busy, 503 stopping).
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

    @classmethod
    def from_validation(cls, errors: list[Any]) -> APIError:
        """The first of pydantic's (or FastAPI's) validation ``errors`` as a 400 naming the field."""
        if not errors:
            return cls("the request body is invalid")
        error = errors[0]
        ctx = error.get("ctx") or {}
        if error.get("type") == ERROR_TYPE:
            return cls(str(ctx.get("message")), param=ctx.get("param"))
        loc = [part for part in error.get("loc", ()) if part != "body"]
        if error.get("type") == "json_invalid":
            return cls(f"the request body is not valid JSON: {ctx.get('error', 'decode error')}")
        where = _path(loc)
        top = str(loc[0]) if loc and isinstance(loc[0], str) else None
        return cls(f"{where or 'the request body'}: {error.get('msg', 'invalid')}", param=top)


def _path(loc: list[Any]) -> str:
    """``["messages", 0, "content"]`` as ``messages[0].content``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _refuse(message: str, param: str | None = None) -> PydanticCustomError:
    """A check's refusal inside pydantic validation (carried to :meth:`APIError.from_validation`)."""
    return PydanticCustomError(ERROR_TYPE, "{message}", {"message": message, "param": param})


# ----------------------------------------------------------------------------------------------------
# Request bodies (pydantic: FastAPI validates them; the OpenAPI schema describes them)


class TextPart(BaseModel):
    """One of OpenAI's content parts; only text parts are taken."""

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A chat message: a role and its content (a string, or text parts, joined)."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` (``include_obfuscation`` is accepted and ignored)."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = None
    include_obfuscation: bool | None = None
    continuous_usage_stats: bool | None = Field(None, description="vLLM's; accepted and ignored")


_Stop = str | list[str]


class _Body(BaseModel):
    """The fields chat and text completions share; the checks of :func:`check_body` run first, so a
    refusal names the field in this module's words."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    user: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="extension (vLLM's): keep the k most likely tokens")
    repetition_penalty: float | None = Field(
        None, ge=REPETITION_PENALTY[0], le=REPETITION_PENALTY[1], description="extension (vLLM's); 1 is off"
    )
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: _Stop | None = None
    n: int | None = Field(None, ge=1, le=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    schedule: str | None = Field(None, description="extension: a schedule the server offers (GET /v1/models)")
    ignore_eos: bool | None = Field(None, description="extension (vLLM's): decode on past EOS to max_tokens")
    presence_penalty: float | None = Field(None, ge=-2, le=2, description="only 0 is supported")
    frequency_penalty: float | None = Field(None, ge=-2, le=2, description="only 0 is supported")
    logit_bias: dict[str, float] | None = Field(None, description="only {} is supported")

    @model_validator(mode="before")
    @classmethod
    def _checked(cls, data: Any) -> Any:
        kind = "chat" if cls is ChatBody else "completion"
        try:
            check_body(data, kind)
        except APIError as exc:
            raise _refuse(exc.message, exc.param) from None
        return data


class ChatBody(_Body):
    """A ``/v1/chat/completions`` body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = Field(None, description="only false is supported")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="only 0 is supported")


class CompletionBody(_Body):
    """A ``/v1/completions`` body: one raw prompt (no chat template)."""

    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=5, description="only 0 is supported")
    echo: bool | None = Field(None, description="only false is supported")
    best_of: int | None = Field(None, ge=1, le=1)
    suffix: str | None = Field(None, description="only the empty string is supported")


# ----------------------------------------------------------------------------------------------------
# Checked records


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
        ignore_eos: decode on past EOS tokens, up to ``max_tokens`` (vLLM's extension).
    """

    max_tokens: int
    sampling: Sampling
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    schedule: str | None = None
    ignore_eos: bool = False


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
           "stop", "n", "stream", "stream_options", "schedule", "ignore_eos")  # fmt: skip
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
        raise APIError(f"{name} = {_short(value)}: must be a number", param=name)
    if not math.isfinite(value):
        raise APIError(f"{name} = {value}: must be a finite number", param=name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, default: int | None, low: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise APIError(f"{name} = {_short(value)}: must be an integer >= {low}", param=name)
    return value


def _unicode(body: Mapping[str, Any]) -> None:
    """Refuse a lone surrogate anywhere in the body, in a field name or a string value (it cannot be
    encoded, so neither the tokenizer nor an answer could take it). Iterative: any depth."""
    todo: list[tuple[str | None, Any]] = [(None, body)]
    while todo:
        top, value = todo.pop()
        if isinstance(value, str):
            strings: list[tuple[str | None, str]] = [(top, value)]
        elif isinstance(value, Mapping):
            strings = [(top or str(k), k) for k in value if isinstance(k, str)]
            todo.extend((top or (k if isinstance(k, str) else None), v) for k, v in value.items())
        elif isinstance(value, list):
            todo.extend((top, v) for v in value)
            continue
        else:
            continue
        for param, text in strings:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                where = param.encode("utf-8", "backslashreplace").decode() if param else "the request body"
                raise APIError(
                    f"{where}: a lone surrogate (an unpaired \\ud800-\\udfff escape) is not valid "
                    "Unicode; send UTF-8 text",
                    param=where if where == param else None,  # a field name that is itself valid
                ) from None


def check_body(body: Any, kind: str) -> None:
    """Every check of a ``kind`` (``"chat"`` or ``"completion"``) body that needs no server: an
    :class:`APIError` naming the field, else None (run by :class:`ChatBody`/:class:`CompletionBody`)."""
    if not isinstance(body, Mapping):
        raise APIError(f"the request body must be a JSON object, not {type(body).__name__}")
    _unicode(body)
    chat = kind == "chat"
    fields = _fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS, _CHAT_OFF if chat else _COMPLETION_OFF)
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(f"model = {_short(model)}: must be a string", param="model")
    if chat:
        _messages(fields)
        _chat_length(fields, 1)
    else:
        _prompt(fields)
        _integer(fields, "max_tokens", None, 1)
    _decoding(fields, 1)


def _fields(
    body: Mapping[str, Any], allowed: tuple[str, ...], off: Mapping[str, tuple[Any, ...]]
) -> dict[str, Any]:
    """The body's fields (nulls dropped), every name known and every "off-only" field off."""
    fields = {k: v for k, v in body.items() if v is not None}  # null: the default, as OpenAI reads it
    unknown = sorted(str(k) for k in set(fields) - set(allowed) - set(off))
    if unknown:
        supported = ", ".join(a for a in allowed if a != "schedule")
        raise APIError(f"unsupported fields {unknown}; supported: {supported}", param=unknown[0])
    for name, values in off.items():
        if name in fields and (isinstance(fields[name], bool) != isinstance(values[0], bool)
                               or fields[name] not in values):  # fmt: skip
            raise APIError(f"{name} = {_short(fields[name])} is not supported; leave it out", param=name)
    return fields


def _messages(fields: Mapping[str, Any]) -> tuple[dict[str, str], ...]:
    try:
        return tuple(check_messages(fields.get("messages")))  # type: ignore[arg-type]
    except ValueError as exc:
        raise APIError(str(exc), param="messages") from None


def _chat_length(fields: Mapping[str, Any], default: int) -> int:
    if "max_tokens" in fields and "max_completion_tokens" in fields:
        raise APIError("give max_tokens or max_completion_tokens, not both", param="max_tokens")
    length = fields.get("max_completion_tokens", fields.get("max_tokens", default))
    name = "max_completion_tokens" if "max_completion_tokens" in fields else "max_tokens"
    value = _integer({name: length}, name, None, 1)
    assert value is not None  # a default was given
    return value


def _prompt(fields: Mapping[str, Any]) -> str:
    prompt = fields.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise APIError(
            f"prompt = {_short(prompt)}: must be a non-empty string (one prompt per request)", param="prompt"
        )
    return prompt


def _stop(fields: Mapping[str, Any]) -> tuple[str, ...]:
    stop = fields.get("stop", ())
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
        raise APIError(
            f"stop = {_short(fields.get('stop'))}: must be a non-empty string or a list of them", param="stop"
        )
    if len(stop) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stop):
        raise APIError(
            f"stop: at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters each "
            f"(got {len(stop)}, the longest {max(len(s) for s in stop)})",
            param="stop",
        )
    return tuple(stop)


def _decoding(fields: Mapping[str, Any], max_tokens: int) -> Decoding:
    """The fields chat and text completions share (``max_tokens`` already resolved)."""
    if _integer(fields, "n", 1, 1) != 1:
        raise APIError(f"n = {fields['n']!r}: only one choice per request (n = 1)", param="n")
    stop = _stop(fields)
    stream = fields.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(f"stream = {_short(stream)}: must be true or false", param="stream")
    include_usage = _stream_options(fields.get("stream_options"), stream)
    temperature = _number(fields, "temperature", 1.0)
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature <= 2):
        raise APIError(
            f"temperature = {temperature}: must be in [0, 2] (0 is greedy; a positive one at least "
            f"{MIN_TEMPERATURE})",
            param="temperature",
        )
    top_p = _number(fields, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise APIError(f"top_p = {top_p}: must be in (0, 1]", param="top_p")
    penalty = _number(fields, "repetition_penalty", 1.0)
    low, high = REPETITION_PENALTY
    if not low <= penalty <= high:
        raise APIError(
            f"repetition_penalty = {penalty}: must be in [{low}, {high:g}] (1 is off)",
            param="repetition_penalty",
        )
    seed = _integer(fields, "seed", None, 0)
    if seed is not None and seed >= 2**63:
        raise APIError(f"seed = {seed}: must be an integer in [0, 2**63)", param="seed")
    try:
        sampling = Sampling(
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else 1.0,
            top_p=top_p,
            top_k=_integer(fields, "top_k", 0, 0) or 0,  # OpenAI has no top-k: off unless asked
            repetition_penalty=penalty,
            seed=seed,
        )
    except ValueError as exc:
        raise APIError(str(exc), param=str(exc).split(" ", 1)[0]) from None
    schedule = fields.get("schedule")
    if schedule is not None and not isinstance(schedule, str):
        raise APIError(f"schedule = {_short(schedule)}: must be a schedule's name", param="schedule")
    ignore_eos = fields.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise APIError(f"ignore_eos = {_short(ignore_eos)}: must be true or false", param="ignore_eos")
    return Decoding(max_tokens, sampling, stop, stream, include_usage, schedule, ignore_eos)


def _stream_options(options: Any, stream: bool) -> bool:
    """``include_usage`` from ``stream_options`` (only with ``stream``)."""
    if options is None:
        return False
    if not stream:
        raise APIError("stream_options is only allowed with stream = true", param="stream_options")
    if not isinstance(options, Mapping) or set(options) - {
        "include_usage",
        "include_obfuscation",
        "continuous_usage_stats",
    }:
        raise APIError(
            f"stream_options = {_short(options)}: only include_usage is supported", param="stream_options"
        )
    include = options.get("include_usage", False)
    if not isinstance(include, bool | None):
        raise APIError(
            f"stream_options.include_usage = {_short(include)}: must be true or false", param="stream_options"
        )
    return bool(include)


def _server_checks(
    fields: Mapping[str, Any], models: Collection[str] | None, schedules: Collection[str] | None
) -> None:
    """What only the server knows: its model names (404) and its schedules."""
    if models is not None:
        name = fields.get("model")
        if name is None:
            raise APIError(f"model is missing; give one of: {', '.join(models)}", param="model")
        if name not in models:
            raise APIError(
                f"the model {_short(name)} does not exist; available: {', '.join(models)} (GET /v1/models)",
                status=404, param="model", code="model_not_found",
            )  # fmt: skip
    schedule = fields.get("schedule")
    if schedule is not None and schedules is None:
        raise APIError("unsupported fields ['schedule']: this server serves one schedule", param="schedule")
    if schedule is not None and schedules is not None and schedule not in schedules:
        raise APIError(
            f"schedule = {_short(schedule)} is unknown; available: {', '.join(schedules)}",
            param="schedule", code="schedule_not_found",
        )  # fmt: skip


def _validated(model: type[BaseModel], body: Any) -> dict[str, Any]:
    """``body`` (a parsed JSON value or an already validated model) as its fields, nulls dropped."""
    if isinstance(body, BaseModel):
        raw: Any = body.model_dump(exclude_none=True, exclude_unset=True)
    else:
        try:
            model.model_validate(body)
        except ValidationError as exc:
            raise APIError.from_validation(exc.errors()) from None
        raw = body
    return {k: v for k, v in raw.items() if v is not None}


def check_chat_request(
    body: Any,
    *,
    default_max_tokens: int,
    models: Collection[str] | None = None,
    schedules: Collection[str] | None = None,
) -> ChatRequest:
    """A chat-completions body as a :class:`ChatRequest`; anything wrong is an :class:`APIError`.

    Args:
        body: the parsed JSON body, or a :class:`ChatBody` FastAPI validated.
        default_max_tokens: the length when the body gives none.
        models: the names ``model`` may take (None: any, unchecked).
        schedules: the names the ``schedule`` extension may take (None: the field is not offered).
    """
    fields = _validated(ChatBody, body)
    _server_checks(fields, models, schedules)
    messages = _messages(fields)
    return ChatRequest(messages, _decoding(fields, _chat_length(fields, default_max_tokens)))


def check_completion_request(
    body: Any,
    *,
    default_max_tokens: int,
    models: Collection[str] | None = None,
    schedules: Collection[str] | None = None,
) -> CompletionRequest:
    """A (text) completions body as a :class:`CompletionRequest`: ``prompt`` is a string or a list of
    exactly one; the arguments are :func:`check_chat_request`'s."""
    fields = _validated(CompletionBody, body)
    _server_checks(fields, models, schedules)
    prompt = _prompt(fields)
    max_tokens = _integer(fields, "max_tokens", default_max_tokens, 1)
    assert max_tokens is not None
    return CompletionRequest(prompt, _decoding(fields, max_tokens))


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
    """One server-sent event: ``data: {json}`` and a blank line (ASCII JSON: any text is sent)."""
    return f"data: {json.dumps(event)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
"""The event that ends an OpenAI stream."""
