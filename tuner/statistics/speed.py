"""A TTFT speedup that survives a busy machine.

TTFT of a schedule at a given prompt length is nearly deterministic; what makes a single timing
wrong is *extra* work on the machine (another process, a burst of load), and extra work only ever
makes a run slower. So:

1. **A clock that load does not move** (``clock``). On a CPU the default is ``cpu``: each timed call
   runs on one thread and is timed by that thread's CPU time (``time.thread_time``), which counts only
   the time the thread actually ran, so another process taking cores for a while does not inflate it.
   Wall-clock time on several threads, even as the minimum of several runs, is moved by a bursty
   background process (``benchmarks/timing_under_load.py`` measures by how much; see docs/): a
   prefill of a second or two rarely fits a quiet gap, and the two sides are hit differently. On CUDA
   (``auto``) the clock is the wall clock with a device sync: the GPU is not shared with the
   background load that troubles a CPU. The one-thread ratio of a very aggressive schedule can sit
   a little above the multi-thread one even on a quiet machine (fixed per-layer overheads
   parallelise worse than the matrix products).
2. **Interleave**: ``rounds`` rounds, each timing the unpruned model and the schedule once, the order
   alternating per round (neither side always runs first after a warm or cold cache).
3. **Minimum per side**: the speedup is ``min(baseline) / min(schedule)``; the fastest of several runs
   is the one least touched by what remains (cache and memory-bandwidth contention).
4. **Plausibility**: realized / FLOP-model speedup stays close to 1 on a quiet CPU for ordinary
   schedules (``benchmarks/prefill_speed.py``); a ratio outside ``plausible`` is re-measured with more rounds
   (``extra_rounds``) and, if still outside, recorded as implausible (never silently dropped).
5. **Spread**: per side ``median / min - 1`` of the timings, so a record shows how loaded the
   machine was while it measured.

The statistic takes plain callables returning seconds, so it is tested deterministically with
made-up timings; ``benchmarks/timing_under_load.py`` runs it against a real CPU hog.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

Timer = Callable[[], float]

DEFAULT_ROUNDS = 3
CLOCKS = ("auto", "cpu", "wall")
"""``auto``: ``cpu`` on a CPU device, ``wall`` on CUDA; ``cpu``: one thread, its CPU time; ``wall``:
the wall clock (device synced) with the process's usual threads."""
DEFAULT_PLAUSIBLE = (0.7, 1.5)


@dataclass(frozen=True)
class SpeedMeasurement:
    """One schedule's measured speedup over the unpruned model, with its evidence.

    Attributes:
        speedup: ``min(baseline_s) / min(schedule_s)``.
        flop_speedup: the FLOP model's speedup for the same prompt length.
        baseline_s, schedule_s: every timing, in the order measured.
        remeasured: whether the first ratio was implausible and more rounds were run.
        plausible: whether ``speedup / flop_speedup`` ends inside the plausible range.
    """

    speedup: float
    flop_speedup: float
    baseline_s: tuple[float, ...]
    schedule_s: tuple[float, ...]
    remeasured: bool
    plausible: bool
    bounds: tuple[float, float] = field(default=DEFAULT_PLAUSIBLE)
    clock: str = "wall"

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS[1:]:
            raise ValueError(f"clock = {self.clock!r}: must be one of {', '.join(CLOCKS[1:])}")
        if not self.baseline_s or len(self.baseline_s) != len(self.schedule_s):
            raise ValueError("a speed measurement needs equally many (>= 1) timings per side")
        if min(self.baseline_s) <= 0 or min(self.schedule_s) <= 0:
            raise ValueError("timings must be > 0 seconds")

    @property
    def ratio_to_flops(self) -> float:
        return self.speedup / self.flop_speedup

    @property
    def spread(self) -> dict[str, float]:
        """``median / min - 1`` per side: 0 on a quiet machine, larger under load."""
        return {
            "baseline": statistics.median(self.baseline_s) / min(self.baseline_s) - 1.0,
            "schedule": statistics.median(self.schedule_s) / min(self.schedule_s) - 1.0,
        }

    @property
    def rounds(self) -> int:
        return len(self.baseline_s)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(ratio_to_flops=self.ratio_to_flops, spread=self.spread, rounds=self.rounds)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeedMeasurement:
        """Inverse of :meth:`to_dict` (derived keys ignored; a record without ``clock`` is ``wall``,
        the only clock before the CPU clock existed)."""
        return cls(
            speedup=float(data["speedup"]),
            flop_speedup=float(data["flop_speedup"]),
            baseline_s=tuple(float(t) for t in data["baseline_s"]),
            schedule_s=tuple(float(t) for t in data["schedule_s"]),
            remeasured=bool(data["remeasured"]),
            plausible=bool(data["plausible"]),
            bounds=(float(data["bounds"][0]), float(data["bounds"][1])),
            clock=str(data.get("clock", "wall")),
        )


def min_ratio(
    baseline_s: list[float] | tuple[float, ...], schedule_s: list[float] | tuple[float, ...]
) -> float:
    """The robust speedup: fastest baseline run over fastest schedule run.

    >>> min_ratio([1.0, 3.0, 1.1], [0.5, 0.52, 2.0])   # the 3.0 s and 2.0 s runs were hit by load
    2.0
    """
    if not baseline_s or not schedule_s:
        raise ValueError("min_ratio needs at least one timing per side")
    return min(baseline_s) / min(schedule_s)


def _interleaved(
    time_baseline: Timer, time_schedule: Timer, rounds: int, start: int
) -> tuple[list[float], list[float]]:
    base: list[float] = []
    sched: list[float] = []
    for r in range(start, start + rounds):
        if r % 2 == 0:
            base.append(time_baseline())
            sched.append(time_schedule())
        else:
            sched.append(time_schedule())
            base.append(time_baseline())
    return base, sched


def measure_speedup(
    time_baseline: Timer,
    time_schedule: Timer,
    flop_speedup: float,
    *,
    rounds: int = DEFAULT_ROUNDS,
    extra_rounds: int | None = None,
    plausible: tuple[float, float] = DEFAULT_PLAUSIBLE,
    clock: str = "wall",
) -> SpeedMeasurement:
    """Interleaved timings, minimum per side, re-measured once when implausible against the FLOP model.

    Args:
        time_baseline, time_schedule: each runs one prefill (+ first token) and returns its seconds.
        flop_speedup: the FLOP model's speedup of the schedule at this prompt length.
        rounds: rounds of the first measurement (each times both sides once).
        extra_rounds: rounds added when the ratio is implausible (default: ``2 * rounds``).
        plausible: accepted range of measured / FLOP-model speedup.
        clock: which clock the timers read (recorded with the measurement).
    """
    if rounds < 1:
        raise ValueError(f"timing rounds = {rounds}: must be >= 1")
    if not 0 < plausible[0] < 1 < plausible[1]:
        raise ValueError(f"plausible range {plausible}: need 0 < low < 1 < high")
    if flop_speedup <= 0:
        raise ValueError(f"flop_speedup = {flop_speedup}: must be > 0")
    base, sched = _interleaved(time_baseline, time_schedule, rounds, 0)

    def ok() -> bool:
        return plausible[0] <= min_ratio(base, sched) / flop_speedup <= plausible[1]

    remeasured = False
    if not ok():
        more = extra_rounds if extra_rounds is not None else 2 * rounds
        b2, s2 = _interleaved(time_baseline, time_schedule, more, rounds)
        base += b2
        sched += s2
        remeasured = True
    return SpeedMeasurement(
        speedup=min_ratio(base, sched),
        flop_speedup=flop_speedup,
        baseline_s=tuple(base),
        schedule_s=tuple(sched),
        remeasured=remeasured,
        plausible=ok(),
        bounds=plausible,
        clock=clock,
    )


def resolve_clock(clock: str, device: Any) -> str:
    """``auto`` -> ``wall`` on CUDA, ``cpu`` elsewhere; ``cpu`` on CUDA is refused (GPU work is not
    the calling thread's CPU time)."""
    if clock not in CLOCKS:
        raise ValueError(f"timing clock = {clock!r}: must be one of {', '.join(CLOCKS)}")
    on_gpu = str(getattr(device, "type", device)) == "cuda"
    if clock == "auto":
        return "wall" if on_gpu else "cpu"
    if clock == "cpu" and on_gpu:
        raise ValueError(
            "timing clock 'cpu' measures CPU work only; on CUDA use --timing-clock wall (or auto)"
        )
    return clock


def clock_timer(call: Callable[[], float], clock: str) -> Timer:
    """A timer of ``call`` (which runs the work and returns its own wall-clock seconds) reading ``clock``."""
    if clock == "wall":
        return call
    if clock != "cpu":
        raise ValueError(f"clock = {clock!r}: a timer reads 'cpu' or 'wall'")

    def run() -> float:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # all work inline on this thread, so its CPU time is the whole cost
        try:
            start = time.thread_time()
            call()
            return time.thread_time() - start
        finally:
            torch.set_num_threads(threads)

    return run


def generation_timer(engine: Any, input_ids: Any, new_tokens: int, clock: str = "wall") -> Timer:
    """A timer of one whole generation of exactly ``new_tokens`` tokens (EOS ignored, so both sides do
    the same work): the end-to-end time a user waits for an answer of that length."""

    def run() -> float:
        return float(engine.generate(input_ids, max_new_tokens=new_tokens, eos_token_id=[]).total_s)

    return clock_timer(run, clock)


def prefill_timer(engine: Any, input_ids: Any, clock: str = "wall") -> Timer:
    """A timer of one TTFT (prefill + first token) of ``engine`` on ``input_ids``."""

    def run() -> float:
        return float(engine.generate(input_ids, max_new_tokens=1).ttft_s)

    return clock_timer(run, clock)
