"""tuner.study.records: the one record a trial stores, its round trip, and the one loader of older studies."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from lazyllm.schedule import Revival
from tests.support import hand_record
from tuner.statistics.bootstrap import Estimate
from tuner.study.records import RECORD_ATTR, TrialRecord


def test_round_trip_keeps_the_whole_schedule() -> None:
    r = hand_record(3, 1.4, 0.03, (0.0, 20.0, 10.0, 0.0), revival="budget:8")
    again = TrialRecord.from_dict(r.to_dict())
    assert again == r and again.schedule.revival == Revival("budget", 8)
    stopped = TrialRecord(4, r.schedule, {}, "score", 1.2, 80.0, examples_run=2, stopped="over budget")
    assert TrialRecord.from_dict(stopped.to_dict()) == stopped and not stopped.complete
    with pytest.raises(ValueError, match="stopped early"):
        _ = stopped.values


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"accuracy": "bogus"}, "accuracy"),
        ({"speedup": 0.0}, "speedup"),
        ({"loss": None}, "loss and speedup"),
        ({"stopped": "x"}, "no loss or speedup"),
    ],
)
def test_invalid_records_are_refused(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(hand_record(0, 1.0, 0.0, (0.0, 0.0, 0.0, 0.0)), **changes)  # type: ignore[arg-type]


def _trial(
    state: TrialState, attrs: dict[str, object], values: list[float] | None = None
) -> optuna.trial.FrozenTrial:
    return create_trial(state=state, values=values, params={"i": 1}, distributions={"i": IntDistribution(0, 3)},
                        user_attrs=attrs)  # fmt: skip


def test_older_studies_load_through_the_one_loader() -> None:
    est = Estimate(0.02, 0.01, 0.0, 0.04, 0.035, 0.9, 4)
    v1 = {"number": 0, "percentiles": [0.0, 30.0, 0.0, 0.0], "params": {"i": 1}, "accuracy": "fidelity",
          "speedup": 1.3, "loss": est.to_dict(), "flop_speedup": 1.3, "prompt_computed_pct": 77.0,
          "speed": None, "metrics": {"top1": 0.9}, "per_dataset": {}, "per_example": {"a/1": 0.02}}  # fmt: skip
    # version-1 record (schedule as loose attrs beside it; revival recorded)
    t = _trial(
        TrialState.COMPLETE,
        {RECORD_ATTR: v1, "percentiles": v1["percentiles"], "revival": "frozen"},
        [1.3, 0.02],
    )
    r = TrialRecord.from_trial(t, "smollm2-135m")
    assert r is not None and r.schedule.model == "smollm2-135m" and str(r.schedule.revival) == "frozen"
    assert r.schedule.percentiles == (0.0, 30.0, 0.0, 0.0) and r.loss == est and r.examples_run == 1
    # before revival was recorded: dynamic; before records: values and loose attrs
    t = _trial(TrialState.COMPLETE, {"percentiles": [0.0, 10.0, 0.0, 0.0], "flop_speedup": 1.1,
                                     "accuracy_loss_interval": [-1.0, 3.0], "accuracy_loss_upper": 2.5}, [1.1, 1.0])  # fmt: skip
    r = TrialRecord.from_trial(t, "m")
    assert r is not None and str(r.schedule.revival) == "dynamic" and r.values == (1.1, 1.0)
    assert (r.loss.low, r.loss.high, r.loss.upper) == (-1.0, 3.0, 2.5)  # type: ignore[union-attr]
    pruned = TrialRecord.from_trial(
        _trial(TrialState.PRUNED, {"percentiles": [0.0] * 4, "stopped_early": "why"}), "m"
    )
    assert pruned is not None and pruned.stopped == "why"
    dup = TrialRecord.from_trial(_trial(TrialState.COMPLETE, {RECORD_ATTR: v1, "percentiles": v1["percentiles"],
                                                               "duplicate_of": 0}, [1.3, 0.02]), "m")  # fmt: skip
    assert dup is not None and dup.duplicate_of == 0
    assert TrialRecord.from_trial(_trial(TrialState.FAIL, {}), "m") is None
