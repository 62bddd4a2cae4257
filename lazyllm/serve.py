"""An OpenAI-compatible HTTP server for tuned schedules (FastAPI + uvicorn).

    python -m lazyllm.serve --model smollm2-135m --schedule schedule.json [--schedule fast=other.json] \\
        [--host 127.0.0.1] [--port 8000] [--max-batch 8] [--max-queue 64] [--max-prompt-tokens N] \\
        [--dtype auto] [--device cpu]

Any OpenAI client talks to it with ``base_url="http://HOST:PORT/v1"`` (any API key):

* ``POST /v1/chat/completions``: the tokenizer's chat template applied to ``messages``;
* ``POST /v1/completions``: the raw ``prompt`` (never a chat template);
* ``GET /v1/models``: the served model (``--served-model-name``, default ``--model``) with its schedules;
* ``GET /health``: ``{"status": "ok", ...}`` and the worker's counters (:class:`~lazyllm.serving.queue.Stats`).

Bodies are checked by :mod:`lazyllm.serving.protocol` (fields, errors and answers as OpenAI has them);
``"stream": true`` answers as server-sent events in OpenAI's chunk format. Each request may choose
its schedule with the extra field ``"schedule"``: a name from ``--schedule NAME=PATH`` (a bare path
is named ``tuned``), or ``unpruned`` (the model without pruning, for comparison); the default is the
first ``--schedule``. Every answer (the last chunk of a stream) has a ``lazyllm`` object: the
schedule, the share of prompt (token, layer) pairs computed, ``ttft_s`` (seconds from the request's
arrival at the worker queue to its first token), ``queue_s`` and ``batch_size``.

Concurrent requests are batched by one engine worker (:mod:`lazyllm.serving.queue`: admission at batch
boundaries). Refusals are OpenAI error objects: 400 for a bad body (naming the field) or a prompt
over ``--max-prompt-tokens`` or the context (naming the limit), 404 for another ``model``, 413 for a
body over ``--max-body-bytes``, 429 with ``Retry-After`` when ``--max-queue`` requests wait already.
A client that disconnects stops its request at the next token.

The registered MLflow model (``models:/NAME@alias``) is served by ``python -m tuner.serve``, which
downloads it and starts this same app (this package never imports MLflow).
"""

from __future__ import annotations

import argparse
import copy
import sys
import warnings
from typing import Any

from lazyllm.cli import cli_main
from lazyllm.models import DEFAULT_MODEL, DTYPES
from lazyllm.serving.app import Served, create_app
from lazyllm.serving.settings import DEFAULT_SCHEDULE_NAME, UNPRUNED, ServeSettings

__all__ = ["DEFAULT_SCHEDULE_NAME", "UNPRUNED", "ServeSettings", "Served", "add_arguments", "create_app",
           "main", "run", "settings_from_args"]  # fmt: skip


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
