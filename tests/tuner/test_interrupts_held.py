"""tuner.interrupts: a Ctrl-C inside a held block waits for the block, a second one does not (real SIGINTs)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tuner.interrupts import held_interrupts, whole


def _ctrl_c() -> None:
    """A real SIGINT to this process; Python runs its handler at the next bytecode, in this thread."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)


def test_a_ctrl_c_inside_the_block_is_raised_once_the_block_ends() -> None:
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), held_interrupts():
        _ctrl_c()
        done.append("the rest of the write")
    assert done == ["the rest of the write"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_a_second_ctrl_c_acts_at_once() -> None:
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), held_interrupts():
        _ctrl_c()
        done.append("after the first")
        _ctrl_c()
        done.append("after the second")
    assert done == ["after the first"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_ctrl_c_stays_ignored_and_blocks_nest() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the CLI does once a run is ending
    try:
        with held_interrupts():
            _ctrl_c()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)

    @whole
    def inner() -> str:
        _ctrl_c()
        return "inner done"

    results: list[str] = []
    with pytest.raises(KeyboardInterrupt), held_interrupts():
        results.append(inner())  # the inner block hands the press to the outer one
        results.append("outer done")
    assert results == ["inner done", "outer done"]


def test_without_a_ctrl_c_the_block_returns_its_value() -> None:
    assert whole(lambda x: x + 1)(1) == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
