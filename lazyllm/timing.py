"""Wall-clock timing that is honest on CUDA (synchronise before reading the clock)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work; a no-op on CPU."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], T], device: torch.device | str | None = None) -> tuple[T, float]:
    """Run ``fn`` once; return its result and the seconds it took, GPU work included."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def paired_ratio(baseline: list[float], other: list[float]) -> float:
    """Median over rounds of ``baseline[i] / other[i]``: a speedup measured side by side.

    Each round times both in the same stretch of machine state, so slow drifts cancel in the ratio;
    the median discards the odd round hit by a background spike.
    """
    if len(baseline) != len(other) or not baseline:
        raise ValueError("paired_ratio needs two equally long, non-empty lists of timings")
    return statistics.median(b / o for b, o in zip(baseline, other))
