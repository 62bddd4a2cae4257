"""tuner.stages.decision: what bound the answer, as data (the words are tests/tuner/report/test_decision.py)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support import decision_outcome
from tuner.stages.decision import FrontStep, TrialTiming, certainty, decide
from tuner.statistics.calibration import Calibration

TIMING = TrialTiming(finished=18, n_trials=60, median_s=30.0, timeout_s=420.0)


@pytest.mark.parametrize(
    ("args", "decided"),
    [
        ((0.4, 8.0, 10.0, 0.5), "over the budget"),  # estimate 8 * 0.3 = 2.4 > 2
        ((0.4, 4.0, 10.0, 0.5), "too few examples"),  # 1.2 within 2, bound 3 not
        ((0.4, 4.0, 10.0, 0.2), "past the scored KL"),  # 0.3 > the largest scored 0.2
        ((0.71, 4.0, 10.0, 0.2), "over the cap"),  # bound 0.71 nats over --max-kl 0.6
    ],
)
def test_each_bound_is_decided_with_its_numbers(args: tuple[float, ...], decided: str) -> None:
    d = decide(decision_outcome(*args), TIMING)
    assert d.decided == decided
    assert d.recommended is not None and d.recommended.loss_upper == pytest.approx(0.11)  # hand_record: +0.01
    assert dataclasses.replace(d.recommended, loss_upper=None) == FrontStep(1, 1.4, 0.1, None)
    assert d.next_faster == FrontStep(2, 1.8, 0.3, args[0])
    assert d.budget == 2.0 and d.n_validation == 13 and d.timing == TIMING
    assert d.prediction is not None and d.prediction.estimate == pytest.approx(args[1] * 0.3)
    assert d.prediction.upper == pytest.approx(3.0) and d.prediction.level == 0.6
    if decided in ("over the budget", "too few examples"):  # (1.8 / 0.8)^2 * 13 = 66 examples
        assert d.examples_needed == (None if decided == "over the budget" else 66)


def test_without_a_faster_schedule_or_a_calibration() -> None:
    outcome = decision_outcome(0.4, 8.0, 10.0, 0.5)
    fastest = decide(dataclasses.replace(outcome, records=outcome.records[:2]), TIMING)
    assert fastest.decided == "fastest completed" and fastest.next_faster is None
    assert fastest.recommended is not None and fastest.recommended.trial == 1
    assert outcome.confirmation is not None
    unscored = dataclasses.replace(outcome.confirmation, calibration=None)
    d = decide(dataclasses.replace(outcome, confirmation=unscored), TIMING)
    assert d.decided == "not task-scored" and d.prediction is None and d.certainty is None


def test_certainty_at_the_confidence_is_data() -> None:
    # chosen at 0.6; at 0.9 the bound 25 * 0.1 = 2.5 > 2 points: 13 * (2.1 / 1.6)^2 = 22.4 -> 23 examples
    d = decide(decision_outcome(0.4, 4.0, 10.0, 0.5, at_90=25.0), TIMING)
    assert d.certainty is not None and not d.certainty.certified and not d.certainty.no_cost
    assert (d.certainty.upper, d.certainty.examples_needed, d.certainty.confidence) == (
        pytest.approx(2.5),
        23,
        0.9,
    )
    sure = decide(decision_outcome(0.4, 4.0, 10.0, 0.5, at_90=15.0), TIMING).certainty
    assert sure is not None and sure.certified and sure.examples_needed is None
    assert decide(decision_outcome(0.4, 4.0, 10.0, 0.5), TIMING).certainty is None  # not recorded
    none = Calibration(-6.03, -4.75, 0.6, 13, (41,), 0.299, ((41, 0.299, -1.8),), 0.9, -1.50)
    c = certainty(0.299, none, 2.0)
    assert c is not None and c.no_cost and not c.certified and c.examples_needed is None


def test_timing_says_what_fits() -> None:
    assert TIMING.trials_fitting() == 14 and TIMING.timeout_needed() == 1800.0
    assert TrialTiming(0, 60, None, 420.0).timeout_needed() is None
    assert TrialTiming(3, 60, 30.0, None).trials_fitting() is None


def test_the_time_line_counts_the_trials_n_trials_counts() -> None:
    """A refused duplicate ends PRUNED but evaluated nothing: it is not a finished trial of the time
    line (the default study said "54 of 60 trials finished" where 49 were)."""
    import optuna

    from tuner.study.workers import DUPLICATE_ATTR, DuplicateSchedule

    study = optuna.create_study(directions=["maximize", "minimize"])

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        if trial.number == 1:
            trial.storage.set_trial_system_attr(trial._trial_id, DUPLICATE_ATTR, 0)
            raise DuplicateSchedule("the schedule of trial 0")
        if trial.number == 2:
            raise optuna.TrialPruned("over budget")  # stopped early: counts
        return 1.0, 0.0

    study.optimize(objective, n_trials=4, catch=(DuplicateSchedule,))
    assert TrialTiming.of(study, 60, 420.0).finished == 3
