"""tuner.stages.front: the Pareto front, feasibility and the pick, on records built by hand."""

from __future__ import annotations

from tests.support import hand_record
from tuner.evaluation.losses import FidelityLoss
from tuner.stages.front import distinct, fastest_feasible, feasible_front, non_dominated

# (speedup, loss) per trial; trial 5 repeats trial 1's values with another schedule
POINTS = [(1.0, 0.0), (1.5, 1.0), (1.4, 2.0), (2.0, 3.0), (1.2, -0.5), (1.5, 1.0)]


def _records() -> list:  # type: ignore[type-arg]
    return [
        hand_record(i, s, loss, (0.0, 10.0 * (i % 3) + i, 5.0, 0.0)) for i, (s, loss) in enumerate(POINTS)
    ]


def test_front_is_the_non_dominated_records_fastest_first() -> None:
    front = non_dominated(_records())
    # 2: dominated by 1 (slower and worse); 5 ties with 1 (same values, another schedule): both stay
    assert [r.number for r in front] == [3, 1, 5, 4]
    for r in front:
        assert not any(
            o.values[0] >= r.values[0] and o.values[1] <= r.values[1] and o.values != r.values for o in front
        )


def test_fastest_feasible_uses_the_upper_bound_against_the_budget() -> None:
    records = _records()
    assert fastest_feasible(records, FidelityLoss(1.01)).number == 1  # type: ignore[union-attr]
    assert fastest_feasible(records, FidelityLoss(3.01)).number == 3  # type: ignore[union-attr]
    assert fastest_feasible(records, FidelityLoss(0.0)).number == 4  # type: ignore[union-attr]
    assert fastest_feasible(records[:4], FidelityLoss(0.0)) is None
    assert [r.number for r in feasible_front(records, FidelityLoss(1.01))] == [1, 5, 4]


def test_a_schedule_counts_once_on_the_front() -> None:
    """Defect: the default study exported the same keep-all schedule three times (trials 0, 5, 6)."""
    keep_all = (0.0, 0.0, 0.0, 0.0)
    records = [hand_record(0, 1.0, 0.0, keep_all), hand_record(1, 1.3, 0.5, (0.0, 30.0, 0.0, 0.0)),
               hand_record(5, 1.01, 0.0, keep_all), hand_record(6, 0.99, 0.0, keep_all)]  # fmt: skip
    assert [r.number for r in distinct(records)] == [0, 1]
    assert [r.number for r in non_dominated(records)] == [1, 0]
    # keep-all is one schedule whatever its revival policy; a pruning schedule with another policy is another
    assert [
        r.number for r in distinct([*records, hand_record(7, 1.0, 0.0, keep_all, revival="dynamic")])
    ] == [0, 1]
    other = hand_record(8, 1.3, 0.5, (0.0, 30.0, 0.0, 0.0), revival="dynamic")
    assert [r.number for r in distinct([*records, other])] == [0, 1, 8]
