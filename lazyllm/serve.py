"""An OpenAI-compatible HTTP server for tuned schedules (FastAPI + uvicorn).

    python -m lazyllm.serve --model smollm2-135m --schedule schedule.json [--schedule fast=other.json] \\
        [--host 127.0.0.1] [--port 8000] [--max-batch 8] [--max-queue 64] [--max-prompt-tokens N] \\
        [--dtype auto] [--device cpu]

Any OpenAI client talks to it with ``base_url="http://HOST:PORT/v1"`` (any API key):

* ``POST /v1/chat/completions``: the tokenizer's chat template applied to ``messages``;
* ``POST /v1/completions``: the raw ``prompt`` (never a chat template);
* ``GET /v1/models``: the served model (``--served-model-name``, default ``--model``) with its schedules;
* ``GET /health``: ``{"status": "ok", ...}`` and the worker's counters (:class:`~lazyllm.scheduler.Stats`).

Bodies are checked by :mod:`lazyllm.protocol` (fields, errors and answers as OpenAI has them);
``"stream": true`` answers as server-sent events in OpenAI's chunk format. Each request may choose
its schedule with the extra field ``"schedule"``: a name from ``--schedule NAME=PATH`` (a bare path
is named ``tuned``), or ``unpruned`` (the model without pruning, for comparison); the default is the
first ``--schedule``. Every answer (the last chunk of a stream) has a ``lazyllm`` object: the
schedule, the share of prompt (token, layer) pairs computed, ``ttft_s`` (seconds from the request's
arrival at the worker queue to its first token), ``queue_s`` and ``batch_size``.

Concurrent requests are batched by one engine worker (:mod:`lazyllm.scheduler`: admission at batch
boundaries). Refusals are OpenAI error objects: 400 for a bad body (naming the field) or a prompt
over ``--max-prompt-tokens`` or the context (naming the limit), 404 for another ``model``, 413 for a
body over ``--max-body-bytes``, 429 with ``Retry-After`` when ``--max-queue`` requests wait already.
A client that disconnects stops its request at the next token.

The registered MLflow model (``models:/NAME@alias``) is served by ``python -m tuner.serve``, which
downloads it and starts this same app (this package never imports MLflow).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import logging
import sys
import time
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from lazyllm.batch import decodes_frozen
from lazyllm.cli import cli_main
from lazyllm.engine import LazyLLM
from lazyllm.models import DEFAULT_MODEL, DTYPES, load_model
from lazyllm.protocol import (
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
from lazyllm.schedule import Schedule
from lazyllm.scheduler import Done, Event, Failed, Job, QueueFull, Scheduler, Token
from lazyllm.streaming import IncrementalText
from lazyllm.text import StopCriteria, encode_prompt

UNPRUNED = "unpruned"
"""The schedule name every server offers: the model without pruning."""

DEFAULT_SCHEDULE_NAME = "tuned"
"""The name of a schedule given as a bare path."""


@dataclass(frozen=True)
class ServeSettings:
    """What one server serves and how (checked here; the CLI flags have the same names).

    Attributes:
        model: alias, checkpoint folder or hub id (:func:`lazyllm.load_model`).
        schedules: ``(name, schedule JSON)`` pairs; the first is the default. ``unpruned`` is added.
        host, port: where to listen.
        max_batch: the most requests decoded together.
        max_queue: the most requests waiting for a batch (more: 429).
        max_prompt_tokens: the longest prompt accepted (None: the model's context minus ``max_tokens``).
        max_body_bytes: the largest request body (more: 413).
        default_max_tokens: the answer length when a request gives none.
        served_model_name: the ``model`` clients name (None: ``model``).
        dtype: a name of :data:`lazyllm.models.DTYPES` (``auto``: float32 on CPU, bfloat16 on CUDA).
        device: ``cpu``, ``cuda``, ... (None: CUDA if available).
        trust_remote_code: allow a hub model's own Python code.
    """

    model: str = DEFAULT_MODEL
    schedules: tuple[tuple[str, Path], ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 8
    max_queue: int = 64
    max_prompt_tokens: int | None = None
    max_body_bytes: int = 4 * 2**20
    default_max_tokens: int = 256
    served_model_name: str | None = None
    dtype: str = "auto"
    device: str | None = None
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if not self.schedules:
            raise ValueError("no schedule to serve: pass --schedule schedule.json (or NAME=PATH)")
        names = [name for name, _ in self.schedules]
        for name, path in self.schedules:
            if not name or name == UNPRUNED or names.count(name) > 1:
                raise ValueError(
                    f"schedule name {name!r}: give each --schedule NAME=PATH its own non-empty name "
                    f"(not {UNPRUNED!r}, which is always served)"
                )
            if not Path(path).is_file():
                raise ValueError(f"--schedule {path}: no such file; pass a schedule JSON")
        for flag, value in (("--max-batch", self.max_batch), ("--max-queue", self.max_queue),
                            ("--max-body-bytes", self.max_body_bytes),
                            ("--default-max-tokens", self.default_max_tokens),
                            ("--max-prompt-tokens", self.max_prompt_tokens or 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag} {value!r}: must be an integer >= 1")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port {self.port}: must be in [0, 65535]")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}: must be one of {', '.join(DTYPES)}")

    @property
    def name(self) -> str:
        """The model name clients send."""
        return self.served_model_name or self.model

    @staticmethod
    def parse_schedule(spec: str) -> tuple[str, Path]:
        """``--schedule`` as ``(name, path)``: ``NAME=PATH``, or a bare path named ``tuned``."""
        name, eq, path = spec.partition("=")
        if eq and name and "/" not in name and not Path(spec).exists():
            return name, Path(path)
        return DEFAULT_SCHEDULE_NAME, Path(spec)


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
                logging.getLogger("lazyllm.serve").warning(
                    "schedule %r revives tokens while decoding (revival %s): its requests are decoded "
                    "one at a time, not batched", name, engine.schedule.revival,
                )  # fmt: skip
        context = getattr(model.config, "max_position_embeddings", None)
        scheduler = Scheduler(max_batch=settings.max_batch, max_queue=settings.max_queue)
        return cls(settings, engines, tokenizer, scheduler, int(context) if context else None)

    def prompt_limit(self, max_tokens: int) -> tuple[int, str]:
        """The most prompt tokens a request of ``max_tokens`` may have, and where the limit comes from."""
        cap = self.settings.max_prompt_tokens
        if self.context is not None and (cap is None or self.context - max_tokens < cap):
            return self.context - max_tokens, (
                f"the model's {self.context}-token context minus max_tokens {max_tokens}"
            )
        if cap is None:
            return sys.maxsize, "no limit"
        return cap, f"--max-prompt-tokens {cap}"


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


def create_app(settings: ServeSettings, served: Served | None = None) -> FastAPI:
    """The FastAPI app serving ``settings`` (loads the model unless ``served`` is given). The engine
    worker starts and stops with the app (its lifespan)."""
    state = served or Served.load(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.scheduler.start()
        try:
            yield
        finally:
            state.scheduler.stop(timeout=30)

    app = FastAPI(title="lazyllm", lifespan=lifespan)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        error = APIError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code)
        return JSONResponse(error.body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(APIError(f"{request.url.path}: {exc}").body(), status_code=400)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        stats = state.scheduler.stats
        return {"status": "ok", "model": settings.name, "schedules": list(state.engines),
                "default_schedule": state.default, "max_batch": settings.max_batch,
                "max_queue": settings.max_queue, "waiting": state.scheduler.waiting,
                **vars(stats)}  # fmt: skip

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry = {"id": settings.name, "object": "model", "created": state.started, "owned_by": "lazyllm",
                 "lazyllm": {"schedules": list(state.engines), "default_schedule": state.default}}  # fmt: skip
        return {"object": "list", "data": [entry]}

    options = {"default_max_tokens": settings.default_max_tokens, "models": [settings.name]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await read_json(request, settings.max_body_bytes)
        checked = check_chat_request(body, schedules=list(state.engines), **options)  # type: ignore[arg-type]
        if not getattr(state.tokenizer, "chat_template", None):
            raise APIError(
                "the model's tokenizer has no chat template: use /v1/completions with a raw prompt",
                param="messages",
            )
        try:
            ids = await run_in_threadpool(encode_prompt, state.tokenizer, list(checked.messages))
        except ValueError as exc:
            raise APIError(str(exc), param="messages") from None
        return await answer(request, checked, ids[0].tolist(), "messages")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await read_json(request, settings.max_body_bytes)
        checked = check_completion_request(body, schedules=list(state.engines), **options)  # type: ignore[arg-type]
        ids = await run_in_threadpool(encode_prompt, state.tokenizer, checked.prompt)
        return await answer(request, checked, ids[0].tolist(), "prompt")

    async def answer(
        request: Request, checked: ChatRequest | CompletionRequest, ids: list[int], field: str
    ) -> Any:
        decoding = checked.decoding
        limit, why = state.prompt_limit(decoding.max_tokens)
        if limit < 1:
            raise APIError(f"max_tokens = {decoding.max_tokens} leaves no room for a prompt ({why})",
                           param="max_tokens")  # fmt: skip
        if len(ids) > limit:
            raise APIError(
                f"the prompt has {len(ids)} tokens; the limit is {limit} prompt tokens ({why}): "
                "shorten it" + (", or ask for fewer max_tokens" if "context" in why else ""),
                param=field, code="context_length_exceeded",
            )  # fmt: skip
        name = decoding.schedule or state.default
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:  # from the worker thread
            loop.call_soon_threadsafe(events.put_nowait, event)

        job = Job(state.engines[name], tuple(ids), decoding.max_tokens, decoding.stop, decoding.sampling,
                  emit, stream=decoding.stream)  # fmt: skip
        try:
            state.scheduler.submit(job)
        except QueueFull as exc:
            raise APIError(f"the server is busy ({exc}); retry after a second", status=429,
                           code="rate_limit_exceeded", kind="rate_limit_error") from None  # fmt: skip
        chat = isinstance(checked, ChatRequest)
        head = ResponseHead.new("chatcmpl" if chat else "cmpl", settings.name)
        if decoding.stream:
            stream = _stream(state, job, events, head, decoding, name, chat)
            return StreamingResponse(stream, media_type="text/event-stream")
        done = await _wait(request, job, events)
        if done is None:
            return Response(status_code=499)  # nobody reads it: the client has gone
        build = chat_completion if chat else text_completion
        return build(head, done.result, done.result.text or "", _extension(done, name))

    return app


def _extension(done: Done, name: str) -> dict[str, Any]:
    """The ``lazyllm`` object: TTFT as the client sees it (queueing included), not the prefill's alone."""
    return lazyllm_fields(
        done.result, schedule=name, ttft_s=done.ttft_s, queue_s=done.queue_s, batch_size=done.batch_size
    )


async def _wait(request: Request, job: Job, events: asyncio.Queue[Event]) -> Done | None:
    """The job's end, or None if the client disconnected meanwhile (checked every half second): the
    job is then cancelled."""
    while True:
        try:
            event = await asyncio.wait_for(events.get(), timeout=0.5)
        except TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                return None
            continue
        if isinstance(event, Done):
            return event
        if isinstance(event, Failed):
            raise APIError(event.message, status=500, kind="server_error")


async def _stream(
    state: Served,
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
    stop = StopCriteria.build(job.engine.model, state.tokenizer, None, decoding.stop)
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lazyllm.serve", description=(__doc__ or "").split("\n\n")[0]
    )
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser, *, schedules: bool = True) -> None:
    """The server's flags (``tuner.serve`` adds its own ``--model-uri`` instead of the schedules)."""
    defaults = ServeSettings.__dataclass_fields__
    if schedules:
        parser.add_argument(
            "--model", default=DEFAULT_MODEL, help="alias, checkpoint folder or hub id (default: %(default)s)"
        )
        parser.add_argument(
            "--schedule", action="append", required=True, metavar="[NAME=]PATH",
            help="schedule JSON to serve (repeatable; a bare path is named 'tuned'; the first is the default)",
        )  # fmt: skip
    parser.add_argument("--host", default=defaults["host"].default, help="default: %(default)s")
    parser.add_argument("--port", type=int, default=defaults["port"].default, help="default: %(default)s")
    parser.add_argument("--max-batch", type=int, default=defaults["max_batch"].default,
                        help="most requests decoded together (default: %(default)s)")  # fmt: skip
    parser.add_argument("--max-queue", type=int, default=defaults["max_queue"].default,
                        help="most requests waiting; more get 429 (default: %(default)s)")  # fmt: skip
    parser.add_argument(
        "--max-prompt-tokens", type=int, help="longest prompt accepted (default: the context)"
    )
    parser.add_argument("--max-body-bytes", type=int, default=defaults["max_body_bytes"].default,
                        help="largest request body; more get 413 (default: %(default)s)")  # fmt: skip
    parser.add_argument("--default-max-tokens", type=int, default=defaults["default_max_tokens"].default,
                        help="answer length when a request gives none (default: %(default)s)")  # fmt: skip
    parser.add_argument("--served-model-name", help="the model name clients send (default: --model)")
    parser.add_argument("--dtype", default="auto", choices=list(DTYPES), help="default: %(default)s")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda if available)")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow a hub model's own Python code"
    )


def settings_from_args(args: argparse.Namespace, **given: Any) -> ServeSettings:
    """The flags as :class:`ServeSettings` (``given`` fills what the caller knows instead: model, schedules)."""
    values: dict[str, Any] = {
        "host": args.host, "port": args.port, "max_batch": args.max_batch, "max_queue": args.max_queue,
        "max_prompt_tokens": args.max_prompt_tokens, "max_body_bytes": args.max_body_bytes,
        "default_max_tokens": args.default_max_tokens, "served_model_name": args.served_model_name,
        "dtype": args.dtype, "device": args.device, "trust_remote_code": args.trust_remote_code,
    }  # fmt: skip
    if "schedules" not in given:
        values["model"] = args.model
        values["schedules"] = tuple(ServeSettings.parse_schedule(s) for s in args.schedule)
    return ServeSettings(**{**values, **given})


def _log_config() -> dict[str, Any]:
    """uvicorn's logging, with access lines formatted as plain messages: uvicorn 0.55 logs each access
    line already formatted, which its own AccessFormatter (expecting five arguments) fails on."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["access"] = dict(config["formatters"]["default"])
    return config


def run(settings: ServeSettings) -> int:
    """Load, then serve until interrupted (uvicorn, one process: the worker thread owns the model)."""
    import uvicorn

    # said once at start (Served.load) instead of by generate_batch at every request of such a schedule
    warnings.filterwarnings("ignore", message=".*revive tokens while decoding")
    app = create_app(settings)
    # open streams get 5 s to end on Ctrl-C / SIGTERM, then the worker finishes its batch and stops
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        log_config=_log_config(),
        timeout_graceful_shutdown=5,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(_parser(), lambda args: run(settings_from_args(args)), argv)


if __name__ == "__main__":
    sys.exit(main())
