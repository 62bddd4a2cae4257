"""The FastAPI app of ``python -m lazyllm.serve``: :func:`create_app` wires the routes to one
:class:`Handlers` object (kept on ``app.state.handlers``), which owns the loaded model
(:class:`Served`) and the request queue.

Routes: ``POST /v1/chat/completions`` (the chat template applied to ``messages``), ``POST
/v1/completions`` (the raw ``prompt``), ``GET /v1/models``, ``GET /health``. Every refusal is
OpenAI's error object (:class:`~lazyllm.serving.protocol.APIError`) with its HTTP status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
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
from lazyllm.serving.protocol import (
    SSE_DONE,
    APIError,
    ChatRequest,
    Chunks,
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
from lazyllm.serving.queue import Done, Event, Failed, Job, QueueFull, Scheduler, Token
from lazyllm.serving.settings import UNPRUNED, ServeSettings
from lazyllm.streaming import IncrementalText
from lazyllm.text import StopCriteria, encode_prompt

log = logging.getLogger("lazyllm.serve")


@dataclass
class Served:
    """The loaded model, one engine per schedule name, and the worker."""

    settings: ServeSettings
    engines: dict[str, LazyLLM]
    tokenizer: Any
    scheduler: Scheduler
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
        scheduler = Scheduler(max_batch=settings.max_batch, max_queue=settings.max_queue)
        return cls(settings, engines, tokenizer, scheduler, context_length(model))

    def prompt_limit(self, max_tokens: int) -> PromptLimit:
        """The most prompt tokens a request of ``max_tokens`` may have (:func:`lazyllm.limits.prompt_limit`)."""
        try:
            return prompt_limit(self.context, max_tokens, self.settings.max_prompt_tokens)
        except ValueError as exc:
            raise APIError(str(exc), param="max_tokens") from None


async def read_json(request: Request, limit: int) -> Any:
    """The request body as JSON; a body over ``limit`` bytes is a 413 (read whole first, up to a
    bound, so the client gets the answer instead of a reset connection)."""
    size, chunks, over = 0, [], False
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            over = True
            if size > 16 * limit:  # stop reading; the connection may be reset
                break
            continue
        chunks.append(chunk)
    if over:
        raise APIError(
            f"the request body has more than {limit} bytes, the server's limit (--max-body-bytes)",
            status=413, code="request_too_large",
        )  # fmt: skip
    try:
        return json.loads(b"".join(chunks))
    except ValueError as exc:
        raise APIError(f"the request body is not valid JSON: {exc}") from None


def _extension(done: Done, name: str) -> dict[str, Any]:
    """The ``lazyllm`` object: TTFT as the client sees it (queueing included), not the prefill's alone."""
    return lazyllm_fields(
        done.result, schedule=name, ttft_s=done.ttft_s, queue_s=done.queue_s, batch_size=done.batch_size
    )


class Handlers:
    """The routes' handlers over one loaded model (``app.state.handlers``)."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.settings = served.settings
        self.options: dict[str, Any] = {
            "default_max_tokens": self.settings.default_max_tokens,
            "models": [self.settings.name],
        }

    # --- GET ------------------------------------------------------------------------------------------
    async def health(self) -> dict[str, Any]:
        served, settings = self.served, self.settings
        return {"status": "ok", "model": settings.name, "schedules": list(served.engines),
                "default_schedule": served.default, "max_batch": settings.max_batch,
                "max_queue": settings.max_queue, "waiting": served.scheduler.waiting,
                **vars(served.scheduler.stats)}  # fmt: skip

    async def models(self) -> dict[str, Any]:
        served = self.served
        entry = {"id": self.settings.name, "object": "model", "created": served.started, "owned_by": "lazyllm",
                 "lazyllm": {"schedules": list(served.engines), "default_schedule": served.default}}  # fmt: skip
        return {"object": "list", "data": [entry]}

    # --- POST -----------------------------------------------------------------------------------------
    async def chat(self, request: Request) -> Any:
        served = self.served
        body = await read_json(request, self.settings.max_body_bytes)
        checked = check_chat_request(body, schedules=list(served.engines), **self.options)
        if not getattr(served.tokenizer, "chat_template", None):
            raise APIError(
                "the model's tokenizer has no chat template: use /v1/completions with a raw prompt",
                param="messages",
            )
        try:
            ids = await run_in_threadpool(encode_prompt, served.tokenizer, list(checked.messages))
        except ValueError as exc:
            raise APIError(str(exc), param="messages") from None
        return await self.answer(request, checked, ids[0].tolist(), "messages")

    async def completions(self, request: Request) -> Any:
        served = self.served
        body = await read_json(request, self.settings.max_body_bytes)
        checked = check_completion_request(body, schedules=list(served.engines), **self.options)
        ids = await run_in_threadpool(encode_prompt, served.tokenizer, checked.prompt)
        return await self.answer(request, checked, ids[0].tolist(), "prompt")

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
                  emit, stream=decoding.stream)  # fmt: skip
        try:
            served.scheduler.submit(job)
        except QueueFull as exc:
            raise APIError(f"the server is busy ({exc}); retry after a second", status=429,
                           code="rate_limit_exceeded", kind="rate_limit_error") from None  # fmt: skip
        chat = isinstance(checked, ChatRequest)
        head = ResponseHead.new("chatcmpl" if chat else "cmpl", self.settings.name)
        if decoding.stream:
            stream = _stream(served, job, events, head, decoding, name, chat)
            return StreamingResponse(stream, media_type="text/event-stream")
        done = await _wait(request, job, events)
        if done is None:
            return Response(status_code=499)  # nobody reads it: the client has gone
        build = chat_completion if chat else text_completion
        return build(head, done.result, done.result.text or "", _extension(done, name))

    # --- errors ---------------------------------------------------------------------------------------
    async def api_error(self, request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    async def http_error(self, request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        error = APIError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code)
        return JSONResponse(error.body(), status_code=exc.status_code)

    async def validation_error(self, request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(APIError(f"{request.url.path}: {exc}").body(), status_code=400)


def create_app(settings: ServeSettings, served: Served | None = None) -> FastAPI:
    """The FastAPI app serving ``settings`` (loads the model unless ``served`` is given). The engine
    worker starts and stops with the app (its lifespan)."""
    handlers = Handlers(served or Served.load(settings))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        handlers.served.scheduler.start()
        try:
            yield
        finally:
            handlers.served.scheduler.stop(timeout=30)

    app = FastAPI(title="lazyllm", lifespan=lifespan)
    app.state.handlers = handlers
    app.add_exception_handler(APIError, handlers.api_error)
    app.add_exception_handler(HTTPException, handlers.http_error)
    app.add_exception_handler(RequestValidationError, handlers.validation_error)
    app.add_api_route("/health", handlers.health, methods=["GET"])
    app.add_api_route("/v1/models", handlers.models, methods=["GET"])
    app.add_api_route("/v1/chat/completions", handlers.chat, methods=["POST"])
    app.add_api_route("/v1/completions", handlers.completions, methods=["POST"])
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
            raise APIError(event.message, status=500, kind="server_error")


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
    token), the finish reason with the ``lazyllm`` object, ``usage`` if asked, then ``[DONE]``. If
    the client goes, the generator is closed and the job cancelled."""
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
                yield sse(APIError(event.message, status=500, kind="server_error").body())
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
