"""The FastAPI app of ``python -m lazyllm.serve``: :func:`create_app` wires the routes to one
:class:`Handlers` object (kept on ``app.state.handlers``), which owns the loaded model
(:class:`Served`), the request queue and the metrics.

Routes: ``POST /v1/chat/completions`` (the chat template applied to ``messages``), ``POST
/v1/completions`` (the raw ``prompt``, never a chat template), ``GET /v1/models``, ``GET /health``
(503 once the worker is dead or the server stops), ``GET /metrics`` (Prometheus).

Before any route, :class:`Guard` (one ASGI middleware) checks what every request must satisfy, in
this order: the ``Host`` header names the bound address or an ``--allow-host`` (else 403: a web page
cannot reach the server through a DNS name of its own), the API key on ``/v1`` routes (else 401),
a JSON ``Content-Type`` on a POST (else 415: a browser sends ``text/plain`` across origins without
asking first, ``application/json`` only after a CORS preflight this server never grants), and the
body size (else 413). Every refusal, there or in a route, is OpenAI's error object
(:class:`~lazyllm.serving.protocol.APIError`) with its HTTP status, rendered as ASCII JSON (so no
string a client sends can break the answer); an unexpected error is a 500 of the same shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from lazyllm.batch import decodes_frozen
from lazyllm.engine import LazyLLM
from lazyllm.limits import PromptLimit, context_length, prompt_limit
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from lazyllm.serving.metrics import CONTENT_TYPE, Metrics
from lazyllm.serving.protocol import (
    SSE_DONE,
    APIError,
    ChatBody,
    ChatRequest,
    Chunks,
    CompletionBody,
    CompletionRequest,
    Decoding,
    ResponseHead,
    chat_completion,
    check_chat_request,
    check_completion_request,
    lazyllm_fields,
    sse,
    text_completion,
)
from lazyllm.serving.queue import Done, Event, Failed, Job, QueueFull, RequestQueue, ShuttingDown, Token
from lazyllm.serving.settings import UNPRUNED, ServeSettings
from lazyllm.streaming import IncrementalText
from lazyllm.text import StopCriteria, encode_prompt

log = logging.getLogger("lazyllm.serve")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
"""The routes (``/metrics`` counts requests by these; any other path counts as ``other``)."""


class OpenAIJSON(JSONResponse):
    """A JSON answer rendered as ASCII (a lone surrogate echoed in a message cannot fail it)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def error_response(error: APIError) -> OpenAIJSON:
    headers = {"Retry-After": "1"} if error.status in (429, 503) else {}
    if error.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return OpenAIJSON(error.body(), status_code=error.status, headers=headers)


@dataclass
class Served:
    """The loaded model, one engine per schedule name, the request queue and the metrics."""

    settings: ServeSettings
    engines: dict[str, LazyLLM]
    tokenizer: Any
    queue: RequestQueue
    metrics: Metrics
    context: int | None
    started: int = field(default_factory=lambda: int(time.time()))

    @property
    def default(self) -> str:
        return self.settings.schedules[0][0]

    @classmethod
    def load(cls, settings: ServeSettings) -> Served:
        """Schedules read and checked first, then the model loaded once and shared by every engine."""
        schedules = {name: Schedule.load(path) for name, path in settings.schedules}
        model, tokenizer = load_model(
            settings.model, device=settings.device, dtype=settings.dtype,
            trust_remote_code=settings.trust_remote_code,
        )  # fmt: skip
        layers = int(model.config.num_hidden_layers)
        schedules[UNPRUNED] = Schedule.keep_all(settings.model, layers)
        # the base model is named by the server's flags, so a schedule's own `model` field is not
        # required to match it (its depth is)
        engines = {
            name: LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False)
            for name, schedule in schedules.items()
        }
        for name, engine in engines.items():
            if not decodes_frozen(engine):
                log.warning(
                    "schedule %r revives tokens while decoding (revival %s): its requests are decoded "
                    "one at a time, not batched", name, engine.schedule.revival,
                )  # fmt: skip
        return cls.of(settings, engines, tokenizer, context_length(model))

    @classmethod
    def of(
        cls, settings: ServeSettings, engines: dict[str, LazyLLM], tokenizer: Any, context: int | None
    ) -> Served:
        """Engines already built (the tests' in-process app): a fresh queue and metrics for them."""
        holder: list[RequestQueue] = []
        metrics = Metrics(lambda: holder[0].waiting, lambda: holder[0].stats.running)
        queue = RequestQueue(max_batch=settings.max_batch, max_queue=settings.max_queue, observer=metrics)
        holder.append(queue)
        return cls(settings, engines, tokenizer, queue, metrics, context)

    def prompt_limit(self, max_tokens: int) -> PromptLimit:
        """The most prompt tokens a request of ``max_tokens`` may have (:func:`lazyllm.limits.prompt_limit`)."""
        try:
            return prompt_limit(self.context, max_tokens, self.settings.max_prompt_tokens)
        except ValueError as exc:
            raise APIError(str(exc), param="max_tokens") from None


class Guard:
    """The checks every request passes before a route (see the module docstring), and the count of
    answers by route and status for ``/metrics``."""

    def __init__(self, app: ASGIApp, settings: ServeSettings, metrics: Metrics) -> None:
        self.app = app
        self.settings = settings
        self.metrics = metrics
        self.any_host = "*" in settings.allow_hosts
        self.hosts = settings.hosts
        self.key = None if settings.api_key is None else f"Bearer {settings.api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in ROUTES else "other"
        status = [500]

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
            error = self._refusal(path, scope["method"], headers)
            if error is None and scope["method"] == "POST":
                body, error = await self._body(receive, headers)
                if error is None:
                    receive = _replay(body, receive)
            if error is not None:
                await error_response(error)(scope, receive, counted)
                return
            await self.app(scope, receive, counted)
        finally:
            self.metrics.answered(route, status[0])

    def _refusal(self, path: str, method: str, headers: dict[str, bytes]) -> APIError | None:
        if not self.any_host and _hostname(headers.get("host", b"")) not in self.hosts:
            return APIError(
                "the Host header does not name this server's address; start it with --allow-host NAME "
                "to accept that name",
                status=403, code="host_not_allowed",
            )  # fmt: skip
        if self.key is not None and path.startswith("/v1"):
            given = headers.get("authorization", b"")
            if not hmac.compare_digest(given, self.key):
                return APIError(
                    "missing or incorrect API key: send the server's key as 'Authorization: Bearer KEY' "
                    "(the OpenAI client's api_key)",
                    status=401, code="invalid_api_key",
                )  # fmt: skip
        if method == "POST":
            kind = headers.get("content-type", b"").split(b";")[0].strip().lower()
            if not (
                kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))
            ):
                return APIError(
                    f"Content-Type {kind.decode('latin-1') or '(none)'!r}: send the body as application/json",
                    status=415, code="unsupported_media_type",
                )  # fmt: skip
        return None

    async def _body(self, receive: Receive, headers: dict[str, bytes]) -> tuple[bytes, APIError | None]:
        """The whole body; over ``--max-body-bytes`` a 413 (read on up to a bound first, so the client
        gets the answer instead of a reset connection)."""
        limit = self.settings.max_body_bytes
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            more = bool(message.get("more_body", False))
            if size > 16 * limit:
                break
            if size <= limit:
                chunks.append(chunk)
        if size > limit:
            return b"", APIError(
                f"the request body has more than {limit} bytes, the server's limit (--max-body-bytes)",
                status=413, code="request_too_large",
            )  # fmt: skip
        return b"".join(chunks), None


def _hostname(host: bytes) -> str:
    """``Host`` without its port, lower case (``[::1]:8000`` is ``::1``)."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body already read, then the client's later messages
    (its disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _extension(done: Done, name: str) -> dict[str, Any]:
    """The ``lazyllm`` object: TTFT as the client sees it (queueing included), not the prefill's alone."""
    return lazyllm_fields(
        done.result, schedule=name, ttft_s=done.ttft_s, queue_s=done.queue_s, batch_size=done.batch_size
    )


def _server_error(event: Failed) -> APIError:
    code = "shutting_down" if event.status == 503 else None
    return APIError(event.message, status=event.status, kind="server_error", code=code)


class Handlers:
    """The routes' handlers over one loaded model (``app.state.handlers``)."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.settings = served.settings
        self.options: dict[str, Any] = {
            "default_max_tokens": self.settings.default_max_tokens,
            "models": [self.settings.name],
            "schedules": list(served.engines),
        }

    # --- GET ------------------------------------------------------------------------------------------
    async def health(self) -> OpenAIJSON:
        """The worker's counters; 503 with ``status`` ``stopping`` or ``dead`` when it takes no requests."""
        served, settings, queue = self.served, self.settings, self.served.queue
        status = "ok" if queue.alive else "stopping" if queue.stopping else "dead"
        body = {"status": status, "model": settings.name, "schedules": list(served.engines),
                "default_schedule": served.default, "max_batch": settings.max_batch,
                "max_queue": settings.max_queue, "waiting": queue.waiting, **vars(queue.stats)}  # fmt: skip
        return OpenAIJSON(body, status_code=200 if status == "ok" else 503)

    async def metrics(self) -> Response:
        return Response(self.served.metrics.text(), media_type=CONTENT_TYPE)

    async def models(self) -> dict[str, Any]:
        served = self.served
        entry = {"id": self.settings.name, "object": "model", "created": served.started, "owned_by": "lazyllm",
                 "lazyllm": {"schedules": list(served.engines), "default_schedule": served.default}}  # fmt: skip
        return {"object": "list", "data": [entry]}

    # --- POST -----------------------------------------------------------------------------------------
    async def chat(self, request: Request, body: ChatBody) -> Any:
        """OpenAI's chat completions: the tokenizer's chat template applied to ``messages``."""
        served = self.served
        checked = check_chat_request(body, **self.options)
        if not getattr(served.tokenizer, "chat_template", None):
            raise APIError(
                "the model's tokenizer has no chat template: use /v1/completions with a raw prompt",
                param="messages",
            )
        ids = await self._encode(list(checked.messages), None, "messages")
        return await self.answer(request, checked, ids, "messages")

    async def completions(self, request: Request, body: CompletionBody) -> Any:
        """OpenAI's (text) completions: the raw prompt, never a chat template."""
        checked = check_completion_request(body, **self.options)
        ids = await self._encode(checked.prompt, False, "prompt")
        return await self.answer(request, checked, ids, "prompt")

    async def _encode(self, prompt: Any, chat: bool | None, param: str) -> list[int]:
        try:
            ids = await run_in_threadpool(encode_prompt, self.served.tokenizer, prompt, chat=chat)
        except Exception as exc:  # the template or the tokenizer refused this text
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise APIError(f"{param} could not be encoded: {message}", param=param) from None
        if ids.shape[1] == 0:
            raise APIError(f"{param} encodes to no tokens; give some text", param=param)
        return list(ids[0].tolist())

    async def answer(
        self, request: Request, checked: ChatRequest | CompletionRequest, ids: list[int], field: str
    ) -> Any:
        """Queue the encoded prompt and answer: a blocking answer or a stream of events."""
        served, decoding = self.served, checked.decoding
        limit = served.prompt_limit(decoding.max_tokens)
        if len(ids) > limit.tokens:
            raise APIError(
                f"the prompt has {len(ids)} tokens; the limit is {limit.tokens} prompt tokens ({limit.reason}): "
                "shorten it" + (", or ask for fewer max_tokens" if limit.from_context else ""),
                param=field, code="context_length_exceeded",
            )  # fmt: skip
        name = decoding.schedule or served.default
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:  # from the worker thread
            loop.call_soon_threadsafe(events.put_nowait, event)

        job = Job(served.engines[name], tuple(ids), decoding.max_tokens, decoding.stop, decoding.sampling,
                  emit, stream=decoding.stream, ignore_eos=decoding.ignore_eos)  # fmt: skip
        try:
            served.queue.submit(job)
        except QueueFull as exc:
            raise APIError(f"the server is busy ({exc}); retry after a second", status=429,
                           code="rate_limit_exceeded", kind="rate_limit_error") from None  # fmt: skip
        except ShuttingDown as exc:
            raise APIError(str(exc), status=503, kind="server_error", code="shutting_down") from None
        chat = isinstance(checked, ChatRequest)
        head = ResponseHead.new("chatcmpl" if chat else "cmpl", self.settings.name)
        if decoding.stream:
            stream = _stream(served, job, events, head, decoding, name, chat)
            return StreamingResponse(stream, media_type="text/event-stream")
        done = await _wait(request, job, events)
        if done is None:
            return Response(status_code=499)  # nobody reads it: the client has gone
        build = chat_completion if chat else text_completion
        return OpenAIJSON(build(head, done.result, done.result.text or "", _extension(done, name)))

    # --- errors ---------------------------------------------------------------------------------------
    async def api_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        detail = exc.detail
        if exc.status_code == 400 and "parsing the body" in str(detail):
            detail = "the request body is not valid JSON (or is nested too deeply)"
        return error_response(
            APIError(f"{request.method} {request.url.path}: {detail}", status=exc.status_code)
        )

    async def validation_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(APIError.from_validation(list(exc.errors())))

    async def unexpected(self, request: Request, exc: Exception) -> Response:
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        error = APIError(f"internal error ({type(exc).__name__}); the request was not answered",
                         status=500, kind="server_error")  # fmt: skip
        return error_response(error)


def create_app(settings: ServeSettings, served: Served | None = None) -> FastAPI:
    """The FastAPI app serving ``settings`` (loads the model unless ``served`` is given). The request
    queue's worker starts and stops with the app (its lifespan)."""
    handlers = Handlers(served or Served.load(settings))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        handlers.served.queue.start()
        try:
            yield
        finally:
            await run_in_threadpool(handlers.served.queue.stop, 30)

    app = FastAPI(title="lazyllm", lifespan=lifespan, default_response_class=OpenAIJSON)
    app.state.handlers = handlers
    app.add_exception_handler(APIError, handlers.api_error)
    app.add_exception_handler(HTTPException, handlers.http_error)
    app.add_exception_handler(RequestValidationError, handlers.validation_error)
    app.add_exception_handler(Exception, handlers.unexpected)
    app.add_api_route("/health", handlers.health, methods=["GET"])
    app.add_api_route("/metrics", handlers.metrics, methods=["GET"], include_in_schema=False)
    app.add_api_route("/v1/models", handlers.models, methods=["GET"])
    app.add_api_route("/v1/chat/completions", handlers.chat, methods=["POST"])
    app.add_api_route("/v1/completions", handlers.completions, methods=["POST"])
    app.add_middleware(Guard, settings=settings, metrics=handlers.served.metrics)
    return app


async def _wait(request: Request, job: Job, events: asyncio.Queue[Event]) -> Done | None:
    """The job's end, or None if the client disconnected meanwhile (checked every half second): the
    job is then cancelled."""
    while True:
        try:
            event = await asyncio.wait_for(events.get(), timeout=0.5)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            if await request.is_disconnected():
                job.cancel()
                return None
            continue
        if isinstance(event, Done):
            return event
        if isinstance(event, Failed):
            raise _server_error(event)


async def _stream(
    served: Served,
    job: Job,
    events: asyncio.Queue[Event],
    head: ResponseHead,
    decoding: Decoding,
    name: str,
    chat: bool,
) -> AsyncIterator[str]:
    """Server-sent events of one job: a chunk per new piece of text (the first right after the first
    token), the finish reason with the ``lazyllm`` object, ``usage`` if asked, then ``[DONE]``; a
    failure is an error event, then ``[DONE]``. If the client goes, the job is cancelled."""
    stop = StopCriteria.build(job.engine.model, served.tokenizer, None, decoding.stop)
    text = IncrementalText(stop)
    chunks = Chunks(head, chat, decoding.include_usage)
    tokens: list[int] = []
    try:
        while True:
            event = await events.get()
            if isinstance(event, Token):
                tokens.append(event.token_id)
                piece = text.piece(tokens)
                if len(tokens) == 1 or piece:
                    yield sse(chunks.piece(piece, first=len(tokens) == 1))
                continue
            if isinstance(event, Failed):
                yield sse(_server_error(event).body())
                yield SSE_DONE
                return
            result = event.result
            rest = text.rest(result.token_ids)
            if rest:
                yield sse(chunks.piece(rest))
            yield sse({**chunks.finish(result.finish_reason), "lazyllm": _extension(event, name)})
            if decoding.include_usage:
                yield sse(chunks.usage(result))
            yield SSE_DONE
            return
    finally:
        job.cancel()  # nothing once the job is done; stops it if the client went away
