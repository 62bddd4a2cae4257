"""tuner.statistics.speed: the robust speedup statistic, deterministically (made-up timings), and its re-measurement."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from lazyllm import LazyLLM, Schedule
from tests.support import make_tiny
from tuner.statistics.speed import (
    SpeedMeasurement,
    clock_timer,
    generation_timer,
    measure_speedup,
    min_ratio,
    prefill_timer,
    resolve_clock,
)


def _timer(values: list[float]) -> tuple[list[int], object]:
    it: Iterator[float] = iter(values)
    calls = [0]

    def run() -> float:
        calls[0] += 1
        return next(it)

    return calls, run


def test_minimum_per_side_ignores_bursts_of_load() -> None:
    # quiet: baseline 1.0 s, schedule 0.5 s; bursts double single runs on either side
    base = [2.0, 1.0, 1.0, 2.1, 1.0]
    sched = [0.5, 1.2, 1.1, 0.5, 0.9]
    assert min_ratio(base, sched) == pytest.approx(2.0)
    # the per-round median ratio (the old statistic) is thrown off by the same bursts
    per_round = sorted(b / s for b, s in zip(base, sched))
    assert per_round[2] != pytest.approx(2.0, rel=0.1)


def test_rounds_interleave_and_alternate_order() -> None:
    order: list[str] = []

    def base() -> float:
        order.append("b")
        return 1.0

    def sched() -> float:
        order.append("s")
        return 0.5

    m = measure_speedup(base, sched, 2.0, rounds=4)
    assert order == ["b", "s", "s", "b", "b", "s", "s", "b"]
    assert m.speedup == 2.0 and not m.remeasured and m.plausible and m.rounds == 4
    assert m.spread == {"baseline": 0.0, "schedule": 0.0}


def test_implausible_ratio_is_remeasured_and_then_accepted() -> None:
    # the first 3 schedule runs were all hit by load (ratio 1.0 vs FLOP model 2.0): re-measured
    b_calls, base = _timer([1.0] * 9)
    s_calls, sched = _timer([1.0, 1.0, 1.0] + [0.5] * 6)
    m = measure_speedup(base, sched, 2.0, rounds=3)  # type: ignore[arg-type]
    assert m.remeasured and m.plausible and m.speedup == pytest.approx(2.0)
    assert b_calls[0] == s_calls[0] == 9 and m.rounds == 9


def test_still_implausible_is_flagged_not_dropped() -> None:
    _, base = _timer([1.0] * 6)
    _, sched = _timer([1.0] * 6)
    m = measure_speedup(base, sched, 3.0, rounds=2)  # type: ignore[arg-type]
    assert m.remeasured and not m.plausible and m.speedup == 1.0
    assert m.ratio_to_flops == pytest.approx(1 / 3)
    assert m.to_dict()["plausible"] is False


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="rounds"):
        measure_speedup(lambda: 1.0, lambda: 1.0, 1.0, rounds=0)
    with pytest.raises(ValueError, match="plausible"):
        measure_speedup(lambda: 1.0, lambda: 1.0, 1.0, plausible=(1.2, 2.0))
    with pytest.raises(ValueError, match="timings"):
        SpeedMeasurement(1.0, 1.0, (), (), False, True)


# ---- the clock -------------------------------------------------------------------------------------


def test_auto_clock_is_cpu_on_a_cpu_and_wall_on_cuda() -> None:
    assert resolve_clock("auto", torch.device("cpu")) == "cpu"
    assert resolve_clock("auto", torch.device("cuda", 0)) == "wall"
    assert resolve_clock("wall", torch.device("cpu")) == "wall"
    with pytest.raises(ValueError, match="on CUDA use --timing-clock wall"):
        resolve_clock("cpu", torch.device("cuda"))
    with pytest.raises(ValueError, match="auto, cpu, wall"):
        resolve_clock("sundial", "cpu")
    with pytest.raises(ValueError, match="clock"):
        SpeedMeasurement(1.0, 1.0, (1.0,), (1.0,), False, True, clock="auto")


def test_cpu_clock_does_not_count_time_the_thread_is_not_running() -> None:
    # what background load does to a timed call: the thread waits while others run. Sleeping is the
    # extreme case: the wall clock counts it, the CPU clock does not.
    # No threshold on the machine's speed: a thread cannot run while it sleeps, so whatever the load, its
    # CPU time over a call is at most the wall time around the call less the sleep.
    sleep_s = 0.3

    def work() -> float:
        start = time.perf_counter()
        torch.ones(256, 256) @ torch.ones(256, 256)
        time.sleep(sleep_s)
        return time.perf_counter() - start

    threads = torch.get_num_threads()
    assert clock_timer(work, "wall")() >= sleep_s
    start = time.perf_counter()
    cpu = clock_timer(work, "cpu")()
    around = time.perf_counter() - start
    assert 0 < cpu <= around - sleep_s  # the matmul counted, the sleep not
    assert torch.get_num_threads() == threads  # one thread only while measuring


def test_cpu_timer_runs_the_engine_on_one_thread_and_measures_it() -> None:
    model = make_tiny("llama")
    layers = model.config.num_hidden_layers
    engine = LazyLLM(model, Schedule.keep_all(model.config.name_or_path, layers), strict_model_name=False)
    seen: list[int] = []
    generate = engine.generate

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return generate(*args, **kwargs)

    engine.generate = spy  # type: ignore[method-assign]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ids = torch.arange(3, 40)
        assert prefill_timer(engine, ids, "cpu")() > 0
        assert generation_timer(engine, ids, 3, "cpu")() > 0
        assert prefill_timer(engine, ids, "wall")() > 0
        assert seen == [1, 1, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
