"""What bound a study's answer, in one paragraph, from its :class:`~tuner.stages.decision.Decision`
(the cases are those of :mod:`tuner.stages.decision`); every loss carries its unit."""

from __future__ import annotations

from tuner.stages.decision import Certainty, Decision, TrialTiming
from tuner.stages.outcome import StudyOutcome
from tuner.statistics.calibration import Calibration
from tuner.statistics.shape import LINEAR

BOUND = {
    "fastest completed": "the search",
    "nothing completed": "the data",
    "not task-scored": "the data",
    "over the cap": "the search's cap",
    "past the scored KL": "the data",
    "over the budget": "the budget",
    "too few examples": "the data",
    "refused by the fresh check": "the data",
}
"""Each case of :data:`tuner.stages.decision.Decided` -> what decided, in words."""


def timing_sentence(timing: TrialTiming) -> str:
    """``"At 41 s per trial (median of 9), --trials-timeout 660 fits about 16 trials; --n-trials 40 needs
    about --trials-timeout 1640."``"""
    if timing.median_s is None:
        return "No trial finished yet."
    text = f"At {timing.median_s:.0f} s per trial (median of {timing.finished})"
    if timing.timeout_s is not None:
        text += f", --trials-timeout {timing.timeout_s:g} fits about {timing.trials_fitting()} trials"
    return f"{text}; --n-trials {timing.n_trials} needs about --trials-timeout {timing.timeout_needed():.0f}."


def certainty_sentence(c: Certainty | None) -> str:
    """One sentence on a recommendation's certainty at ``--confidence`` (empty when not recorded)."""
    if c is None:
        return ""
    at = f"--confidence {c.confidence:.0%}"
    if c.no_cost:  # "at most 0 points" would claim more than n examples with no visible cost can
        return (
            f"At {at} the calibration still measures no task-score cost of KL (slope bound {c.slope_upper:.1f} {c.unit}): "
            f"the {c.n_examples} validation examples show none, and a cost that they do not "
            f"show is not bounded by them. "
        )
    if c.certified:
        return (
            f"At {at} the recommendation is certified too: its predicted task loss is at most {c.upper:.2f} "
            f"score points (n={c.n_examples}). "
        )
    more = (
        f"about {c.examples_needed} validation examples (now {c.n_examples}) would certify it"
        if c.examples_needed is not None
        else "no number of examples would, as its predicted loss is over the budget"
    )
    return (
        f"The recommendation is within the {c.budget:g}-point budget at the decision level ({c.level:.0%}, "
        f"--decision-level) but not certified at {at}: its predicted task loss could reach {c.upper:.2f} score "
        f"points; {more}. "
    )


def power_sentence(d: Decision) -> str:
    """The calibration's shape where it is not a straight line, how many validation examples the budget
    needs by the power curve, and whether the slope prior floored the calibration (empty without a
    calibration)."""
    cal = d.calibration
    if cal is None:
        return ""
    shape = (
        ""
        if cal.exponent == LINEAR
        else f"The calibration fits task loss as slope x KL^{cal.exponent:g} (--calibration-exponent; slopes in "
        f"{cal.unit}). "
    )
    return shape + _floor_sentence(d, cal)


def _floor_sentence(d: Decision, cal: Calibration) -> str:
    f = cal.floor
    if f is None:
        return (
            "No slope prior applies (--slope-prior none; none packaged for this model, prompt length and "
            "calibration shape; or an agreement budget, which the gold-point priors do not convert): the "
            "calibration stands on its own examples, however few. "
        )
    own = f"its own slope is {f.own_slope:.1f} (bound {f.own_upper:.1f}) {cal.unit}"
    read = (
        ""
        if f.baseline_score is None
        else f" at this study's unpruned score {f.baseline_score:.1f}, {f.scale:.2f}x the grid's"
        + (
            ""
            if f.baseline_upper_confidence is None or cal.confidence is None
            else f"; {'this bound, which decides, and ' if f.decided_at_bound else ''}its {cal.confidence:.0%} "
            f"bound at the score's {cal.confidence:.0%} bound {f.baseline_upper_confidence:.1f} (n={cal.n_examples})"
        )
    )
    prior = f"the open-QA prior {f.prior} ({f.prior_slope:.1f}, bound {f.prior_upper:.1f}{read}, n={f.prior_n_examples})"
    if f.examples_needed is None and f.largest_replayed is None:
        need = (
            f"No power curve for a {d.budget:g}-point budget is recorded with {prior} yet, so the study counts "
            f"as underpowered"
        )
    elif f.examples_needed is None:
        need = (
            f"By the power curve, no number of validation examples replayed (up to {f.largest_replayed}) holds a "
            f"{d.budget:g}-point budget (picks over budget on test in at most {f.target_rate:.0%} of replays), "
            f"and the study counts as underpowered with its {cal.n_examples}"
        )
    else:
        need = (
            f"By the power curve, a {d.budget:g}-point budget needs {f.examples_needed} validation examples "
            f"(picks over budget on test in at most {f.target_rate:.0%} of replays); this study has {cal.n_examples}"
        )
    if not f.applied:
        return f"{need}: its own calibration decides ({own}). "
    if f.examples_needed is not None and cal.n_examples >= f.examples_needed:
        effect = "which decided" if f.binds else "which its own bound already exceeds"
        return (
            f"{need}, but its own calibration measures no task-score cost of KL ({own}), which "
            f"{prior} contradicts, so its slope is floored there, {effect}. "
        )
    effect = "which decided" if f.binds else "which its own bound already exceeds"
    return f"{need}, so its slope is floored at {prior}, {effect}; {own}. "


def fresh_sentence(d: Decision) -> str:
    """What the fresh-drift check measured, or why it did not run (empty where none was recorded or
    the calibration had its power)."""
    f = d.fresh
    if f is None or d.calibration is None or (not f.ran and f.prompts.startswith("not needed")):
        return ""
    if not f.ran:
        return f"The front's KL was not re-measured on prompts the search never saw: {f.prompts}. "
    rec, pick = d.recommended, d.fresh_kl(d.recommended)
    ours = (
        ""
        if rec is None or pick is None
        else f"; the recommendation's is {pick:.4f} nats (on validation {rec.loss:.4f})"
    )
    return (
        f"The study re-measured its front's KL on {f.n_examples} prompts the search "
        f"never saw ({f.prompts}) for {len(f.kl)} schedule(s), fastest first, and judged each at the "
        f"larger KL with the slope's bound at --confidence{ours}. "
    )


def paragraph(d: Decision) -> str:
    """The paragraph: what decided, with its numbers, then the recommendation's certainty, the power
    of its examples and the time."""
    t = d.timing
    done = (
        f"{certainty_sentence(d.certainty)}{power_sentence(d)}{fresh_sentence(d)}"
        f"{t.finished} of {t.n_trials} trials finished. "
        f"{timing_sentence(t)}"
    )
    what = f"What decided: {BOUND[d.decided]}."
    best, nxt = d.recommended, d.next_faster
    if d.decided == "fastest completed":
        assert best is not None
        return (
            f"{what} The recommendation (trial {best.trial}, {best.speedup:.2f}x) is the "
            f"fastest schedule the study completed within budget; more trials may find faster ones. {done}"
        )
    if d.decided == "nothing completed":
        return f"{what} The study completed no schedule to recommend. {done}"
    assert nxt is not None
    where = f"trial {nxt.trial} ({nxt.speedup:.2f}x, {d.search_loss.text(nxt.loss)})"
    head = (
        "nothing is recommended"
        if best is None
        else f"the recommendation is trial {best.trial} ({best.speedup:.2f}x)"
    ).capitalize()
    if d.decided == "not task-scored":
        n = "?" if d.n_validation is None else str(d.n_validation)
        return (
            f"{what} {head}; the next faster schedule, {where}, could not be "
            f"certified on the task score directly (n={n}). {done}"
        )
    p, cal = d.prediction, d.calibration
    assert p is not None and cal is not None
    prediction = (
        cal.no_cost_text()  # a negative "loss" would be read as a gain
        if p.no_cost
        else f"predicted to lose {p.estimate:.2f} score points (upper bound {p.upper:.2f}, {p.level:.0%})"
    )
    cap = d.search_loss
    if d.decided == "over the cap":
        assert nxt.loss_upper is not None
        return (
            f"{what} {head}; the next faster schedule, {where}, has a "
            f"loss bound of {cap.text(nxt.loss_upper)}, over the search's cap of {cap.text(cap.budget)} "
            f"(--max-kl), so it was not a candidate ({prediction}). {done}"
        )
    if d.decided == "past the scored KL":
        return (
            f"{what} {head}; the next faster schedule, {where}, drifts past the "
            f"largest KL scored on the task ({cal.max_scored_kl:.4f} nats), where the calibration is not "
            f"extrapolated ({prediction}). {done}"
        )
    if d.decided == "refused by the fresh check":
        f, seen = d.fresh, d.fresh_kl(nxt)
        assert f is not None and seen is not None
        measured = f.measured(nxt.trial)
        # "it is predicted to lose ..."; where the calibration sees no cost, only its bound speaks
        it, judged = (
            ("its", f"task-loss bound is {p.upper:.2f} score points ({p.level:.0%}; the calibration's own "
             f"slope, {cal.slope:.1f} points per nat, sees no cost of KL, its bound does)")
            if p.no_cost
            else ("it is", prediction)
        )  # fmt: skip
        drift = (
            f"drifts more on the fresh prompts: after {measured} of {f.n_examples} its KL is already at least "
            f"{seen:.4f} nats (the rest counted at 0, so the check stopped), where {it}"
            if measured < f.n_examples and seen > nxt.loss
            else f"is refused at its validation KL already, read at the fresh check's --confidence (the check "
            f"stopped after {measured} of its {f.n_examples} prompts): {it}"
            if measured < f.n_examples
            else f"drifts more on the {f.n_examples} fresh prompts (KL {seen:.4f} nats), where {it}"
            if seen > nxt.loss
            else f"drifts no more on the {f.n_examples} fresh prompts (KL {seen:.4f} nats); at its larger KL {it}"
        )
        return (
            f"{what} {head}; the next faster schedule, {where}, passes at its validation KL "
            f"(--decision-level) but {drift} {judged}, over the {d.budget:g}-point budget at the fresh "
            f"check's --confidence. {done}"
        )
    if d.decided == "over the budget":
        return (
            f"{what} {head}; the next faster schedule, {where}, is {prediction}, "
            f"over the {d.budget:g}-point budget even as an estimate. {done}"
        )
    return (
        f"{what} {head}; the next faster schedule, {where}, is {prediction}: within "
        f"the {d.budget:g}-point budget as an estimate but not certified; about {d.examples_needed} validation "
        f"examples (now {cal.n_examples}) would certify it. {done}"
    )


def explain(outcome: StudyOutcome, decision: Decision) -> str:
    """The paragraph of ``outcome``'s ``decision`` (:func:`tuner.stages.decision.decide` computes it; this
    formats it with :func:`paragraph`), in the study's points (agreement points for a prompts file
    without answers)."""
    text = paragraph(decision)
    return text if outcome.points == "score points" else text.replace("score points", outcome.points)


def power_line(outcome: StudyOutcome, decision: Decision, c: Certainty | None) -> str | None:
    """What the validation prompts certify for the recommendation (``c``, the calibration's bound at
    ``--confidence``: :func:`tuner.stages.decision.recommendation_certainty`) and how many would
    certify the budget; None without a calibrated, pruning recommendation. For keep-all, what
    ``decision`` says of the next faster schedule."""
    best, conf = outcome.recommended, outcome.confirmation
    if best is None or conf is None or conf.calibration is None:
        return None
    what = "prompts" if outcome.identity.task_fingerprint is not None else "examples"
    if c is None:  # keep-all: what the prompts say of the next faster schedule
        return _next_power(outcome, decision, what)
    if c.no_cost:
        return (
            f"Power: the calibration saw no cost of KL on your {c.n_examples} validation {what} (its "
            f"{c.confidence:.0%} slope bound is {c.slope_upper:.3g}); more {what} would measure one"
        )
    text = (
        f"Power: your {c.n_examples} validation {what} certify a budget of {c.upper:.2f} {outcome.points} "
        f"for the recommendation ({c.confidence:.0%} bound)"
    )
    if c.certified:
        return text + f", within the {outcome.task_budget:g} asked"
    if c.examples_needed is not None:
        return text + f"; about {c.examples_needed} would certify {outcome.task_budget:g}"
    return text + f"; no number of {what} certifies {outcome.task_budget:g} at its predicted loss"


def _next_power(outcome: StudyOutcome, d: Decision, what: str) -> str | None:
    """The power line of a study that recommends keep-all: the next faster schedule's bound and
    how many prompts would certify it (as ``d``, :func:`tuner.stages.decision.decide`, found)."""
    nxt, p, cal = d.next_faster, d.prediction, d.calibration
    if nxt is None or p is None or cal is None or p.no_cost:
        return None
    text = (
        f"Power: your {cal.n_examples} validation {what} bound the next faster schedule (trial {nxt.trial}, "
        f"{nxt.speedup:.2f}x) at {p.upper:.2f} {outcome.points} ({p.level:.0%})"
    )
    if p.upper <= outcome.task_budget:
        return text + f", within the {outcome.task_budget:g} asked ({d.decided})"
    text += f", over the {outcome.task_budget:g} asked"
    if d.examples_needed is not None:
        return text + f"; about {d.examples_needed} would certify it within {outcome.task_budget:g}"
    return text + f"; its estimate, {p.estimate:.2f}, is over it: no number of {what} would certify it"
