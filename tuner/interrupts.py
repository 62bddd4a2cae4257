"""Ctrl-C handling, in one place: held back until a tracking write is whole, and ended cleanly while a
command still imports.

**While a command imports** (:func:`interrupts_end_the_start`): torch and transformers take seconds to
load; a Ctrl-C then prints one line and exits with status 130, not a traceback.

**While a write runs** (:func:`held_interrupts`, :func:`whole`): a KeyboardInterrupt raised in the
middle of an MLflow call can land inside a SQLite transaction. The store's own connection then still holds the database lock while the way out (the trial's FAILED run,
the parent's KILLED status) writes through another connection of the same process, which waits out
SQLite's busy timeout (MLflow sets 20 s) on every write: a Ctrl-C that takes a minute to end the run.
Inside :func:`held_interrupts` the first Ctrl-C is remembered and raised as soon as the block ends, so
the write it arrived in finishes first; a second Ctrl-C is raised at once (a tracking server that
hangs must not make Ctrl-C useless). The first import of matplotlib is held the same way
(:func:`tuner.report.figure.pyplot`): an interrupt inside a compiled module's initialisation turns
into an ImportError.

**While a finalizer runs** (:func:`redeliver_interrupts_finalizers_drop`): a Ctrl-C whose
KeyboardInterrupt is raised inside a ``__del__`` or a weakref callback (SQLAlchemy cleans up its
objects so, during any garbage collection) is printed as "Exception ignored in ..." and dropped by
Python, and the command ran on to its end as if never interrupted (seen once in the PostgreSQL
Ctrl-C test). The commands deliver such an interrupt again once the finalizer is over.

Standard library only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that arrives inside the block until the block ends, then act on it as
    the handler in place before would have: raise KeyboardInterrupt, call that handler, or nothing
    where Ctrl-C was already ignored. A second Ctrl-C inside the block acts at once. Only the main
    thread receives signals; elsewhere this does nothing. Blocks nest."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[FrameType | None] = []
    previous = signal.getsignal(signal.SIGINT)

    def hold(signum: int, frame: FrameType | None) -> None:
        if received:  # the second press: do not wait for the write
            received.clear()
            signal.signal(signal.SIGINT, previous)
            _act(previous, frame)
            return
        received.append(frame)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is hold:
            signal.signal(signal.SIGINT, previous)
        if received:
            _act(previous, received[0])


def _act(handler: Any, frame: FrameType | None) -> None:
    """What ``handler`` (a value of ``signal.getsignal``) does with a SIGINT, now."""
    if handler is signal.SIG_IGN or handler is None:
        return
    if handler is signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)  # the default: the process ends by the signal
        return
    handler(signal.SIGINT, frame)  # a Python handler; Python's own default raises KeyboardInterrupt


def whole(method: Callable[P, R]) -> Callable[P, R]:
    """Decorator: ``method`` runs inside :func:`held_interrupts`."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with held_interrupts():
            return method(*args, **kwargs)

    return wrapper


REDELIVERY_DELAY_S = 0.05
"""How long after a finalizer dropped a Ctrl-C it is sent again: long enough for the finalizer and
Python's report of it to return (sent at once, it would be raised inside that report and dropped
again), short enough that nobody notices."""


def redeliver_interrupts_finalizers_drop() -> None:
    """Install a ``sys.unraisablehook`` that sends a SIGINT again, :data:`REDELIVERY_DELAY_S` later
    (from a daemon thread; the handler in place then decides what it does), for every
    KeyboardInterrupt Python drops because it was raised inside a finalizer; other unraisable errors
    go to the hook installed before. Process-wide: for programs, not libraries. Installing it twice
    changes nothing."""
    previous = sys.unraisablehook
    if getattr(previous, "_redelivers_interrupts", False):
        return

    def hook(unraisable: Any) -> None:
        kind = unraisable.exc_type
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            timer = threading.Timer(REDELIVERY_DELAY_S, os.kill, (os.getpid(), signal.SIGINT))
            timer.daemon = True
            timer.start()
            return
        previous(unraisable)

    hook._redelivers_interrupts = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


@contextlib.contextmanager
def interrupts_end_the_start(module: str) -> Iterator[None]:
    """Around a command module's imports: a Ctrl-C there ends the command before it did anything, and
    from then on a Ctrl-C a finalizer dropped is delivered again (:func:`redeliver_interrupts_finalizers_drop`).
    Only when ``module`` (the caller's ``__name__``) runs as the program; an import by other code is
    left as is."""
    if module != "__main__":
        yield
        return
    redeliver_interrupts_finalizers_drop()  # for the whole command, not only its imports
    try:
        yield
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while ending changes nothing
        sys.stderr.write("\ninterrupted while starting: nothing was done\n")
        raise SystemExit(130) from None
