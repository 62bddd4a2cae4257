"""tuner.study.handmade and tuner.stages.heldout: the hand-made families (with the study's revival) and the wording of a comparison; settings of issue 12."""

from __future__ import annotations

import pytest

from lazyllm.schedule import Revival
from tuner.evaluation.runner import ExampleResult, loss_estimate, macro_score, summarize
from tuner.report.heldout import verdict
from tuner.search import parse_settings
from tuner.stages.heldout import compare
from tuner.study.handmade import families, hand_made_grid, one_stage_grid


def _r(dataset: str, score: float, i: int) -> ExampleResult:
    return ExampleResult(dataset, str(i), "lazyllm", "", score, 1.0, 1.0, 10, 1, 1.0)


def test_one_stage_grid_prunes_once_to_the_named_share() -> None:
    grid = one_stage_grid("m", 30)
    assert len(grid) == 6
    s = grid["one-stage keep=30% after layer 15"]
    assert [i for i, p in enumerate(s.percentiles) if p] == [15] and s.keep_counts(100)[16] == 30
    assert all(len([p for p in g.percentiles if p]) > 1 for g in hand_made_grid("m", 30).values())


def test_hand_made_schedules_take_the_study_revival() -> None:
    """Defect: the held-out check compared the tuned schedule (the study's revival, frozen by default)
    against hand-made schedules with the default dynamic revival: not like for like."""
    for revival in ("frozen", "budget:8", "dynamic"):
        grids = families("m", 30, Revival.parse(revival))
        assert set(grids) == {"paper-style", "one-stage"}
        assert {str(s.revival) for g in grids.values() for s in g.values()} == {revival}


def test_verdict_says_when_two_schedules_cannot_be_told_apart() -> None:
    rec = [_r("a", s, i) for i, s in enumerate([1.0, 0.0, 1.0, 0.0, 1.0, 0.0])]
    same_ish = [_r("a", s, i) for i, s in enumerate([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])]
    text = verdict(compare("recommended", "hand", rec, same_ish, 0.9))
    assert "cannot be told apart" in text and "n=6" in text
    worse = [_r("a", 0.0, i) for i in range(6)]
    text = verdict(compare("recommended", "hand", rec, worse, 0.9))
    assert text.startswith("recommended loses less") and "-50.00 score points" in text


def test_issue12_settings_flags_and_validation() -> None:
    s = parse_settings(
        ["--accuracy", "score", "--confirm-k", "5", "--confidence", "0.95", "--timing-rounds", "3"]
    )
    assert (s.accuracy, s.confirm_k, s.confidence, s.timing_rounds) == ("score", 5, 0.95, 3)
    d = parse_settings([])
    assert d.accuracy == "fidelity" and d.n_examples is None  # every validation example by default
    with pytest.raises(ValueError, match=r"confidence = 1\.0"):
        parse_settings(["--confidence", "1.0"])
    with pytest.raises(ValueError, match="max_kl = 0"):
        parse_settings(["--max-kl", "0"])
    with pytest.raises(SystemExit):
        parse_settings(["--accuracy", "bogus"])


def test_scores_are_macro_averages_so_score_difference_equals_the_loss() -> None:
    # unequal dataset sizes: a plain mean over examples (what heldout.json once printed) is 40.0,
    # the macro average over datasets 62.5; the loss is a macro average, so the scores must be too
    base = [_r("a", 1.0, 0), _r("a", 0.0, 1), _r("a", 0.0, 2), _r("a", 0.0, 3), _r("b", 1.0, 4)]
    pruned = [_r("a", 0.0, 0), _r("a", 0.0, 1), _r("a", 0.0, 2), _r("a", 0.0, 3), _r("b", 1.0, 4)]
    assert macro_score(base) == pytest.approx(62.5) and macro_score(pruned) == pytest.approx(50.0)
    loss = loss_estimate(pruned, base)
    assert loss.value == pytest.approx(macro_score(base) - macro_score(pruned))
    assert summarize(pruned, base).score == pytest.approx(50.0)
