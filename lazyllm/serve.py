"""``python -m lazyllm.serve``: an OpenAI-compatible HTTP server for tuned schedules (FastAPI + uvicorn).

    python -m lazyllm.serve --model smollm2-135m --schedule schedule.json [--schedule fast=other.json] \\
        [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--allow-host NAME] [--max-batch 8] ...

Any OpenAI client talks to it with ``base_url="http://HOST:PORT/v1"`` and the server's key (any
string when it has none). This module is the command line only; the app is
:mod:`lazyllm.serving.app` (routes, checks, errors), the request queue :mod:`lazyllm.serving.queue`
(continuous batching), the request bodies :mod:`lazyllm.serving.protocol`; docs/serving.md says
what each flag does.

The registered MLflow model (``models:/NAME@alias``) is served by ``python -m tuner.serve``, which
downloads it and starts this same app (this package never imports MLflow).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import sys
import threading
import warnings
from typing import Any

from lazyllm.cli import cli_main
from lazyllm.models import DEFAULT_MODEL, DTYPES
from lazyllm.serving.app import Served, create_app
from lazyllm.serving.settings import API_KEY_ENV, DEFAULT_SCHEDULE_NAME, UNPRUNED, ServeSettings

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
    parser.add_argument(
        "--api-key",
        help=f"key every /v1 request must send as 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}; none)",
    )
    parser.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME",
        help="a Host header name to accept besides the bound address (repeatable; * accepts any)",
    )  # fmt: skip


def settings_from_args(args: argparse.Namespace, **given: Any) -> ServeSettings:
    """The flags as :class:`ServeSettings` (``given`` fills what the caller knows instead: model, schedules)."""
    values: dict[str, Any] = {
        "host": args.host, "port": args.port, "max_batch": args.max_batch, "max_queue": args.max_queue,
        "max_prompt_tokens": args.max_prompt_tokens, "max_body_bytes": args.max_body_bytes,
        "default_max_tokens": args.default_max_tokens, "served_model_name": args.served_model_name,
        "dtype": args.dtype, "device": args.device, "trust_remote_code": args.trust_remote_code,
        "api_key": args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None,
        "allow_hosts": tuple(args.allow_host),
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
    """Load, then serve until interrupted (uvicorn, one process: the worker thread owns the model).

    On Ctrl-C / SIGTERM the queue drains at once (waiting requests get 503, new ones too, ``/health``
    says ``stopping``), open requests get 5 s to end, then the worker stops (what still runs gets 503).
    """
    import uvicorn

    # said once at start (Served.load) instead of by generate_batch at every request of such a schedule
    warnings.filterwarnings("ignore", message=".*revive tokens while decoding")
    app = create_app(settings)
    queue = app.state.handlers.served.queue
    if settings.api_key is not None:
        logging.getLogger("lazyllm.serve").warning("every /v1 request needs the API key")

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            threading.Thread(target=queue.drain, name="lazyllm-drain", daemon=True).start()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        log_config=_log_config(),
        timeout_graceful_shutdown=5,
    )
    Server(config).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli_main(_parser(), lambda args: run(settings_from_args(args)), argv)


if __name__ == "__main__":
    sys.exit(main())
