"""The one error wrapper every ``python -m`` entry point of this project uses.

Bad input is a one-line ``error: ...`` on stderr and exit status 2; Ctrl-C is one line and status
130; ``--debug`` (or ``LAZYLLM_DEBUG=1``) shows the full traceback instead, with the same status. The entry point builds
its ``argparse`` parser and a ``run(args) -> int``; :func:`cli_main` adds ``--debug`` and does the rest.

Every line the process can print goes through the entry point's ``redact`` (the tuner passes
:func:`tuner.redact.redact_text`): the one-line error, the traceback ``--debug`` or a bug shows
(``sys.excepthook``), every log record of every library (message, arguments and attached traceback,
masked when the record is made) and every warning.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Sequence
from types import TracebackType

from lazyllm.models import ModelLoadError

USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, ModelLoadError)
"""What counts as the user's input being wrong (a bad value, a missing or unreadable file, a model
that cannot be fetched); anything else is a bug and keeps its traceback."""

Redactor = Callable[[str], str]


def _identity(text: str) -> str:
    return text


def one_line(exc: BaseException, redact: Redactor = _identity) -> str:
    """The first line of an exception's message (its type name if it has none), with secrets masked."""
    text = str(exc).strip()
    if isinstance(exc, OSError) and exc.strerror and exc.filename:
        text = f"{exc.filename}: {exc.strerror}"
    first = text.splitlines()[0] if text else type(exc).__name__
    return redact(first)


class _Masking:
    """The process-wide hooks that pass every printed line through one redactor (installed once,
    pointed at the latest entry point's redactor)."""

    redact: Redactor = staticmethod(_identity)
    installed = False

    @classmethod
    def install(cls, redact: Redactor) -> None:
        cls.redact = staticmethod(redact)
        if cls.installed:
            return
        cls.installed = True
        make_record = logging.getLogRecordFactory()
        format_warning = warnings.formatwarning

        def record(*args: object, **kwargs: object) -> logging.LogRecord:
            rec = make_record(*args, **kwargs)
            try:
                rec.msg, rec.args = cls.redact(rec.getMessage()), ()
            except Exception:  # a malformed record: logging reports it when it formats it
                return rec
            if rec.exc_info and rec.exc_info[0] is not None:
                rec.exc_text = cls.redact("".join(traceback.format_exception(*rec.exc_info)).rstrip())
            if rec.stack_info:
                rec.stack_info = cls.redact(rec.stack_info)
            return rec

        def warning(*args: object, **kwargs: object) -> str:
            return cls.redact(format_warning(*args, **kwargs))  # type: ignore[arg-type]

        def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            text = "".join(traceback.format_exception(kind, exc, tb))
            sys.stderr.write(cls.redact(text))

        logging.setLogRecordFactory(record)
        warnings.formatwarning = warning
        sys.excepthook = excepthook


def _ignore_further_interrupts() -> None:
    """After a Ctrl-C the command is already ending: another one (a second press, or the same press
    arriving again while MLflow's and the threads' exit handlers run) must not turn exit 130 into a
    traceback and death by SIGINT."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def cli_main(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None = None,
    *,
    interrupted: str = "interrupted",
    redact: Redactor = _identity,
) -> int:
    """Parse ``argv`` with ``parser`` (plus ``--debug``), call ``run`` and turn user errors into one line.

    Args:
        parser: the entry point's parser (``--debug`` is added here).
        run: does the work; returns the exit status.
        argv: the arguments (None = ``sys.argv[1:]``).
        interrupted: what to print on Ctrl-C (e.g. how to resume).
        redact: masks secrets (passwords in URLs) in the printed line.
    """
    parser.add_argument(
        "--debug", action="store_true", help="show full tracebacks instead of one-line errors"
    )
    _Masking.install(redact)
    args = parser.parse_args(argv)
    debug = bool(args.debug) or os.environ.get("LAZYLLM_DEBUG") == "1"
    try:
        return run(args)
    except KeyboardInterrupt:
        _ignore_further_interrupts()
        if debug:
            sys.stderr.write(redact(traceback.format_exc()))
        print(f"\n{interrupted}", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        if debug:  # the traceback, masked, then the same line and status as without --debug
            sys.stderr.write(redact(traceback.format_exc()))
        print(f"error: {one_line(exc, redact)}", file=sys.stderr)
        return 2
