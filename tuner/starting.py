"""Ctrl-C while a command is still importing (torch and transformers take seconds to load): one line
and exit status 130, not a traceback. Standard library only, so it is in place before they load."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def interrupts_end_the_start(module: str) -> Iterator[None]:
    """Around a command module's imports: a Ctrl-C there ends the command before it did anything. Only
    when ``module`` (the caller's ``__name__``) runs as the program; an import by other code is left as is."""
    if module != "__main__":
        yield
        return
    try:
        yield
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while ending changes nothing
        sys.stderr.write("\ninterrupted while starting: nothing was done\n")
        raise SystemExit(130) from None
