"""tuner.speed: the robust speedup statistic, deterministically (made-up timings), and its re-measurement."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tuner.speed import SpeedMeasurement, measure_speedup, min_ratio


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
