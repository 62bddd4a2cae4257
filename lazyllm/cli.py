"""The one error wrapper every ``python -m`` entry point of this project uses.

Bad input is a one-line ``error: ...`` on stderr and exit status 2; Ctrl-C is one line and status
130; ``--debug`` (or ``LAZYLLM_DEBUG=1``) shows the full traceback instead. The entry point builds
its ``argparse`` parser and a ``run(args) -> int``; :func:`cli_main` adds ``--debug`` and does the rest.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

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
    args = parser.parse_args(argv)
    debug = bool(args.debug) or os.environ.get("LAZYLLM_DEBUG") == "1"
    try:
        return run(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"\n{interrupted}", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        if debug:
            raise
        print(f"error: {one_line(exc, redact)}", file=sys.stderr)
        return 2
