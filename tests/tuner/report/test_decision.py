"""tuner.report.decision: the closing paragraph names what bound the answer, with its numbers (the
sentences are exact: a study's parent run and console carry them)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import decision_outcome
from tuner.report.decision import (
    certainty_sentence,
    fresh_sentence,
    paragraph,
    power_sentence,
    timing_sentence,
)
from tuner.report.decision import (
    explain as explain_decision,
)
from tuner.stages.decision import TrialTiming, certainty, decide
from tuner.stages.outcome import StudyOutcome
from tuner.statistics.calibration import Calibration

TIMING = TrialTiming(finished=18, n_trials=60, median_s=30.0, timeout_s=420.0)


def explain(outcome: StudyOutcome, timing: TrialTiming) -> str:
    """The paragraph as a study writes it: the stage decides, the report formats."""
    return explain_decision(outcome, decide(outcome, timing))


NO_PRIOR = (
    "No slope prior applies (--slope-prior none; none packaged for this model, prompt length and calibration "
    "shape; or an agreement budget, which the gold-point priors do not convert): the calibration stands on its "
    "own examples, however few. "
)


def test_the_budget_decides_when_the_next_schedule_is_predicted_over_it() -> None:
    text = explain(decision_outcome(0.4, slope=8.0, slope_upper=10.0, max_scored=0.5), TIMING)
    assert text.startswith("What decided: the budget. The recommendation is trial 1 (1.40x)")
    assert "trial 2 (1.80x, 0.3000 nats)" in text and "predicted to lose 2.40 score points" in text


def test_the_data_decides_with_a_power_statement() -> None:
    # estimate 4 * 0.3 = 1.2 within 2 points, bound 10 * 0.3 = 3 not: (1.8 / 0.8)^2 * 13 = 66 examples
    text = explain(decision_outcome(0.4, slope=4.0, slope_upper=10.0, max_scored=0.5), TIMING)
    assert text.startswith("What decided: the data.")
    assert "about 66 validation examples (now 13) would certify it" in text
    beyond = explain(decision_outcome(0.4, slope=4.0, slope_upper=10.0, max_scored=0.2), TIMING)
    assert "drifts past the largest KL scored on the task (0.2000 nats)" in beyond


def test_the_cap_decides_when_the_next_schedule_was_never_a_candidate() -> None:
    text = explain(decision_outcome(0.71, slope=4.0, slope_upper=10.0, max_scored=0.2), TIMING)
    assert text.startswith("What decided: the search's cap.")
    assert "loss bound of 0.7100 nats, over the search's cap of 0.6000 nats (--max-kl)" in text


def test_a_calibration_without_cost_never_predicts_a_gain() -> None:
    # seed 1 of the default study: the scored schedules lost nothing on validation (slope -41)
    text = explain(decision_outcome(0.71, slope=-41.1, slope_upper=-21.6, max_scored=0.05), TIMING)
    assert text.startswith("What decided: the search's cap.")
    assert "predicted to lose" not in text
    assert "measured no task-score cost of KL on these examples (slope -41.1 points per nat)" in text
    assert "certifies nothing past the largest scored KL (0.0500 nats)" in text
    beyond = explain(decision_outcome(0.4, slope=-41.1, slope_upper=-21.6, max_scored=0.05), TIMING)
    assert beyond.startswith("What decided: the data.") and "predicted to lose" not in beyond


def test_the_time_line_says_what_fits_and_what_would() -> None:
    assert timing_sentence(TIMING) == (
        "At 30 s per trial (median of 18), --trials-timeout 420 fits about 14 trials; --n-trials 60 needs about "
        "--trials-timeout 1800."
    )
    text = explain(decision_outcome(0.4, slope=8.0, slope_upper=10.0, max_scored=0.5), TIMING)
    assert text.endswith("18 of 60 trials finished. " + timing_sentence(TIMING))
    assert timing_sentence(TrialTiming(0, 60, None, 420.0)) == "No trial finished yet."


def test_the_recommendation_says_whether_it_is_certified_at_the_confidence_too() -> None:
    # chosen at 0.6; at 0.9 the bound 25 * 0.1 = 2.5 > 2: estimate 0.4, 13 * (2.1 / 1.6)^2 = 22.4 -> 23
    text = explain(decision_outcome(0.4, slope=4.0, slope_upper=10.0, max_scored=0.5, at_90=25.0), TIMING)
    sentence = (
        "The recommendation is within the 2-point budget at the decision level (60%, --decision-level) but "
        "not certified at --confidence 90%: its predicted task loss could reach 2.50 score points; about 23 "
        "validation examples (now 13) would certify it. "
    )
    assert sentence + NO_PRIOR + "18 of 60 trials finished." in text
    assert text.startswith("What decided: the data.")
    certified = explain(
        decision_outcome(0.4, slope=4.0, slope_upper=10.0, max_scored=0.5, at_90=15.0), TIMING
    )
    assert (
        "At --confidence 90% the recommendation is certified too: its predicted task loss is at most 1.50"
        in certified
    )
    # a calibration stored before the second level was recorded: no sentence, the rest unchanged
    old = explain(decision_outcome(0.4, slope=4.0, slope_upper=10.0, max_scored=0.5), TIMING)
    assert "--confidence" not in old and old == certified.replace(
        "At --confidence 90% the recommendation is certified too: its predicted task loss is at most 1.50 score "
        "points (n=13). ",
        "",
    )
    # seed 1: no measured cost at 0.6, but at 0.9 trial 41 (KL 0.299) could lose 2.31 points
    cal = Calibration(-4.94, -2.43, 0.6, 13, (41,), 0.299, ((41, 0.299, -1.29),), 0.9, 7.71)
    assert "could reach 2.31 score points; about 18 validation examples (now 13)" in certainty_sentence(
        certainty(0.299, cal, 2.0)
    )
    assert (
        certainty(0.0, cal, 2.0) is None and certainty_sentence(None) == ""
    )  # keep-all needs no certificate
    # the run of dd5411e: other schedules scored, and even the 90% bound sees no cost (-1.5): said as such,
    # not as "at most 0.00 points"
    none = Calibration(-6.03, -4.75, 0.6, 13, (41,), 0.299, ((41, 0.299, -1.8),), 0.9, -1.50)
    assert certainty_sentence(certainty(0.299, none, 2.0)) == (
        "At --confidence 90% the calibration still measures no task-score cost of KL (slope bound -1.5 points per "
        "nat): the 13 validation examples show none, and a cost that they do not show is not bounded by them. "
    )


def test_the_paragraph_says_how_many_examples_the_budget_needs_and_whether_the_prior_floored() -> None:
    import dataclasses

    from tuner.stages.decision import decide
    from tuner.statistics.prior import PowerPoint, SlopePrior

    def prior(power: tuple[PowerPoint, ...]) -> SlopePrior:
        return SlopePrior(
            "tiny", "openqa", 1024, 300, ("a",), 12.0, ((0.5, 12.0), (0.6, 13.0), (0.9, 16.0)),
            "rows.jsonl", "cd" * 32, "2026-12-02", power,
        )  # fmt: skip

    def text_with(p: SlopePrior, slope: float, slope_upper: float) -> tuple[str, str]:
        outcome = decision_outcome(0.4, slope=slope, slope_upper=slope_upper, max_scored=0.5, at_90=-0.5)
        assert outcome.confirmation is not None and outcome.confirmation.calibration is not None
        cal = outcome.confirmation.calibration.floored(p, 2.0)
        conf = dataclasses.replace(outcome.confirmation, calibration=cal)
        d = decide(dataclasses.replace(outcome, confirmation=conf), TIMING)
        return power_sentence(d), explain(dataclasses.replace(outcome, confirmation=conf), TIMING)

    curve = (PowerPoint(2.0, 13, 0.5, 0.8, 500), PowerPoint(2.0, 100, 0.08, 0.95, 500))
    # seed 1's calibration: no cost seen on 13 examples; the power curve asks for 100
    sentence, text = text_with(prior(curve), -6.0, -1.5)
    assert sentence == (
        "By the power curve, a 2-point budget needs 100 validation examples (picks over budget on test in at "
        "most 10% of replays); this study has 13, so its slope is floored at the open-QA prior "
        "tiny/openqa-1024@cdcdcdcdcdcd (12.0, bound 13.0, n=300), which decided; its own slope is -6.0 "
        "(bound -1.5) points per nat. "
    )
    assert sentence in text and "measured no task-score cost" not in text
    assert "predicted to lose 3.60 score points (upper bound 3.90, 60%)" in text  # 12 x 0.3, 13 x 0.3
    sentence, _ = text_with(prior(()), 40.0, 60.0)
    assert sentence.startswith("No power curve for a 2-point budget is recorded with the open-QA prior")
    assert "which its own bound already exceeds; its own slope is 40.0 (bound 60.0)" in sentence
    # a curve that no replayed n brought within the target: underpowered whatever the study's size, said so
    sentence, _ = text_with(
        prior((PowerPoint(2.0, 13, 0.4, 0.9, 500), PowerPoint(2.0, 200, 0.15, 0.9, 500))), 4.0, 5.0
    )
    assert sentence.startswith(
        "By the power curve, no number of validation examples replayed (up to 200) holds a 2-point budget "
        "(picks over budget on test in at most 10% of replays), and the study counts as underpowered with its 13, "
        "so its slope is floored at the open-QA prior"
    )
    sentence, _ = text_with(prior((PowerPoint(2.0, 13, 0.05, 0.95, 500),)), 20.0, 25.0)
    assert sentence == (
        "By the power curve, a 2-point budget needs 13 validation examples (picks over budget on test in at most "
        "10% of replays); this study has 13: its own calibration decides (its own slope is 20.0 (bound 25.0) "
        "points per nat). "
    )
    # enough examples, but "no cost seen": the prior contradicts it, and floors it
    sentence, _ = text_with(prior((PowerPoint(2.0, 13, 0.05, 0.95, 500),)), -6.0, -1.5)
    assert sentence == (
        "By the power curve, a 2-point budget needs 13 validation examples (picks over budget on test in at most "
        "10% of replays); this study has 13, but its own calibration measures no task-score cost of KL (its own "
        "slope is -6.0 (bound -1.5) points per nat), which the open-QA prior tiny/openqa-1024@cdcdcdcdcdcd "
        "(12.0, bound 13.0, n=300) contradicts, so its slope is floored there, which decided. "
    )


def _with_fresh(outcome: Any, fresh: Any) -> Any:
    """``decide`` on ``outcome`` with its confirmation's fresh-drift check replaced by ``fresh``."""
    import dataclasses

    from tuner.stages.decision import decide

    return decide(
        dataclasses.replace(outcome, confirmation=dataclasses.replace(outcome.confirmation, fresh=fresh)),
        TIMING,
    )


def test_a_schedule_refused_at_its_fresh_kl_is_what_decided() -> None:
    """Step 5 of the rule: trial 2 passes at its validation KL 0.3 (bound 5 x 0.3 = 1.5 points at the
    decision level) but drifts 0.5 nats on the fresh prompts, where the check reads the bound at
    --confidence (10 x 0.5 = 5 points, over budget 2); the recommendation was checked there too
    (0.12 nats), and its certainty is read at the larger KL."""
    import dataclasses

    from tuner.stages.confirm import FreshCheck
    from tuner.stages.decision import decide

    outcome = decision_outcome(0.4, slope=4.0, slope_upper=5.0, max_scored=0.5, at_90=10.0)
    assert outcome.confirmation is not None
    plain = decide(outcome, TIMING)
    assert plain.decided == "too few examples" and fresh_sentence(plain) == ""
    check = FreshCheck("open-QA validation (12 per dataset, 1024 tokens)", 24, ((2, 0.5), (1, 0.12)))
    checked = dataclasses.replace(
        outcome, confirmation=dataclasses.replace(outcome.confirmation, fresh=check)
    )
    d = decide(checked, TIMING)
    assert d.decided == "refused by the fresh check" and d.fresh_kl(d.next_faster) == 0.5
    assert d.prediction is not None and (d.prediction.estimate, d.prediction.upper, d.prediction.level) == (
        pytest.approx(2.0),
        pytest.approx(5.0),
        0.9,
    )
    assert d.certainty is not None and d.certainty.upper == pytest.approx(1.2)  # 10 x 0.12, not 10 x 0.1
    text = explain(checked, TIMING)
    assert text.startswith("What decided: the data.")
    assert (
        "the next faster schedule, trial 2 (1.80x, 0.3000 nats), passes at its validation KL (--decision-level) "
        "but drifts more on the 24 fresh prompts (KL 0.5000 nats), where it is predicted to lose 2.00 score "
        "points (upper bound 5.00, 90%), over the 2-point budget at the fresh check's --confidence." in text
    )
    assert (
        "The study re-measured its front's KL on 24 prompts the search never saw "
        "(open-QA validation (12 per dataset, 1024 tokens)) for 2 schedule(s), fastest first, and judged each "
        "at the larger KL with the slope's bound at --confidence; the recommendation's is 0.1200 nats (on "
        "validation 0.1000). " in text
    )
    # drifting no more on the fresh prompts, trial 2 is still judged at --confidence: 10 x 0.3 = 3 > 2
    calm = FreshCheck("open-QA validation (12 per dataset, 1024 tokens)", 24, ((2, 0.25), (1, 0.12)))
    d = _with_fresh(outcome, calm)
    assert d.decided == "refused by the fresh check" and d.prediction is not None
    assert (d.prediction.upper, d.prediction.level) == (pytest.approx(3.0), 0.9)
    assert (
        "drifts no more on the 24 fresh prompts (KL 0.2500 nats); at its larger KL it is predicted"
        in paragraph(d)
    )
    # a check stopped early (refused on its first 10 of 24 prompts): its KL is a lower bound, said so
    early = FreshCheck(
        "open-QA validation (12 per dataset, 1024 tokens)", 24, ((2, 0.5), (1, 0.12)), ((2, 10),)
    )
    assert (
        FreshCheck.from_dict(early.to_dict()) == early and early.measured(2) == 10 and early.measured(1) == 24
    )
    d = _with_fresh(outcome, early)
    assert d.decided == "refused by the fresh check"
    assert (
        "but drifts more on the fresh prompts: after 10 of 24 its KL is already at least 0.5000 nats (the rest "
        "counted at 0, so the check stopped), where it is predicted to lose 2.00 score points" in paragraph(d)
    )
    # refused at its own KL at --confidence (10 x 0.3 = 3 > 2): the check read no prompt
    none = dataclasses.replace(early, kl=((2, 0.0), (1, 0.12)), stopped=((2, 0),))
    d = _with_fresh(outcome, none)
    assert d.decided == "refused by the fresh check"
    assert (
        "passes at its validation KL (--decision-level) but is refused at its validation KL already, read at the "
        "fresh check's --confidence (the check stopped after 0 of its 24 prompts): it is predicted to lose 1.20 "
        "score points (upper bound 3.00, 90%)" in paragraph(d)
    )
    # a calibration that sees no cost (slope -1, bounds 5 and 10): only its bound speaks, in a sentence
    blind = decision_outcome(0.4, slope=-1.0, slope_upper=5.0, max_scored=0.5, at_90=10.0)
    assert blind.confirmation is not None
    d = _with_fresh(blind, check)
    assert d.decided == "refused by the fresh check"
    assert (
        "but drifts more on the 24 fresh prompts (KL 0.5000 nats), where its task-loss bound is 5.00 score points "
        "(90%; the calibration's own slope, -1.0 points per nat, sees no cost of KL, its bound does), over the "
        "2-point budget at the fresh check's --confidence." in paragraph(d)
    )
    for bad in (((3, 10),), ((2, 24),), ((2, -1),)):  # not measured; not early; negative
        with pytest.raises(ValueError, match="a stopped check is of a measured trial"):
            dataclasses.replace(early, stopped=bad)
    skipped = dataclasses.replace(
        check, prompts="no open-QA folder: pass --openqa-dir DIR or set OPENQA_DIR", n_examples=0, kl=()
    )
    d = decide(
        dataclasses.replace(checked, confirmation=dataclasses.replace(outcome.confirmation, fresh=skipped)),
        TIMING,
    )
    assert d.decided == "too few examples"
    assert fresh_sentence(d) == (
        "The front's KL was not re-measured on prompts the search never saw: no open-QA folder: pass "
        "--openqa-dir DIR or set OPENQA_DIR. "
    )


def test_a_square_root_calibration_is_named_in_the_paragraph_with_its_units() -> None:
    """The preset's calibration (loss = slope x sqrt(KL)): the paragraph says so, its numbers carry
    points per nat^0.5, and trial 2 (KL 0.3) is predicted at the square root: 5 x 0.548 = 2.74."""
    import dataclasses

    from tuner.stages.decision import decide

    outcome = decision_outcome(0.4, slope=4.0, slope_upper=5.0, max_scored=0.5, at_90=8.0)
    assert outcome.confirmation is not None and outcome.confirmation.calibration is not None
    root = dataclasses.replace(outcome.confirmation.calibration, exponent=0.5)
    root_outcome = dataclasses.replace(
        outcome, confirmation=dataclasses.replace(outcome.confirmation, calibration=root)
    )
    d = decide(root_outcome, TIMING)
    assert power_sentence(d).startswith(
        "The calibration fits task loss as slope x KL^0.5 (--calibration-exponent; slopes in points per nat^0.5). "
        "No slope prior applies"
    )
    text = explain(root_outcome, TIMING)
    assert "predicted to lose 2.19 score points (upper bound 2.74, 60%)" in text  # 4 and 5 x sqrt(0.3)
    assert "KL^" not in power_sentence(decide(outcome, TIMING))  # the straight line says nothing of its shape


def test_the_paragraph_says_the_score_the_prior_was_read_at_and_its_bound() -> None:
    """A prior scaled by the unpruned score: the paragraph gives the score, its share of the grid's and,
    when the score came with its bound, the bound the certified one was read at."""
    import dataclasses

    from tuner.stages.decision import decide
    from tuner.statistics.calibration import UnprunedScore
    from tuner.statistics.prior import SlopePrior

    prior = SlopePrior(
        "tiny", "openqa", 1024, 300, ("a",), 12.0, ((0.5, 12.0), (0.6, 13.0), (0.9, 16.0)),
        "rows.jsonl", "cd" * 32, "2026-12-02", (), baseline_score=8.0, scaling="baseline",
    )  # fmt: skip
    outcome = decision_outcome(0.4, slope=-6.0, slope_upper=-1.5, max_scored=0.5, at_90=-0.5)
    assert outcome.confirmation is not None and outcome.confirmation.calibration is not None
    for score, clause in [
        (4.0, "at this study's unpruned score 4.0, 0.50x the grid's, n=300)"),
        (
            UnprunedScore(4.0, 13, 12.0, 0.9),
            "at this study's unpruned score 4.0, 0.50x the grid's; its 90% bound at the score's 90% bound 12.0 "
            "(n=13), n=300)",
        ),
    ]:
        cal = outcome.confirmation.calibration.floored(prior, 2.0, score)
        conf = dataclasses.replace(outcome.confirmation, calibration=cal)
        assert clause in power_sentence(decide(dataclasses.replace(outcome, confirmation=conf), TIMING))
    cal = outcome.confirmation.calibration.floored(
        prior, 2.0, UnprunedScore(4.0, 13, 12.0, 0.9), decide_at_bound=True
    )
    conf = dataclasses.replace(outcome.confirmation, calibration=cal)
    assert (
        "(6.0, bound 19.5 at this study's unpruned score 4.0, 0.50x the grid's; this bound, which decides, and "
        "its 90% bound at the score's 90% bound 12.0 (n=13), n=300)"
        in power_sentence(decide(dataclasses.replace(outcome, confirmation=conf), TIMING))
    )
