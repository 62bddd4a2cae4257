"""tuner.evaluation.losses: each loss owns its unit, budget and early-stop rule; the registry lists its names."""

from __future__ import annotations

import pytest

from tuner.evaluation.fidelity import ExampleDrift
from tuner.evaluation.losses import (
    LOSSES,
    MIN_EXAMPLES_TO_DOMINATE,
    FidelityLoss,
    Rival,
    ScoreLoss,
    make_loss,
)


def test_each_loss_names_its_unit_in_labels_and_numbers() -> None:
    kl, score = FidelityLoss(0.05), ScoreLoss(2.0)
    assert (kl.unit, score.unit) == ("nats", "score points")
    assert kl.label.endswith("(nats)") and score.label.endswith("(score points)")
    assert kl.text(0.0312) == "0.0312 nats" and score.text(1.234) == "1.23 score points"
    assert make_loss("fidelity", 0.1) == FidelityLoss(0.1)
    with pytest.raises(ValueError, match="Available: fidelity, score"):
        make_loss("bleu", 1.0)
    assert sorted(LOSSES) == ["fidelity", "score"]


def test_fidelity_stops_once_the_budget_cannot_be_met() -> None:
    weights = {"a/1": 1.0, "a/2": 1.0, "b/1": 2.0}  # macro weights: a's two examples weigh one each
    loss = FidelityLoss(0.05)
    drift = [ExampleDrift("a", "1", 0.1, 1.0, None, 3)]
    assert loss.early_stop(weights, 3, drift) is None  # 0.1 * 1 / 4 = 0.025 <= 0.05
    drift.append(ExampleDrift("a", "2", 0.2, 1.0, None, 3))
    reason = loss.early_stop(weights, 3, drift)  # 0.3 / 4 = 0.075 > 0.05 whatever b gives
    assert reason is not None and "0.0750 nats after 2 examples" in reason and "budget 0.05 nats" in reason
    assert loss.early_stop(weights, 2, drift) is None  # every example ran: complete, not stopped


def test_fidelity_stops_a_schedule_a_faster_rival_confidently_beats() -> None:
    """A schedule is stopped as dominated once the lower end of its KL interval clears the KL of a
    rival at least as fast, after enough examples; never on too few, never against a worse rival."""
    total = 13
    weights = {f"d/{i}": 1.0 for i in range(total)}
    loss = FidelityLoss(0.6)
    drifts = [ExampleDrift("d", str(i), 0.3 + 0.01 * i, 1.0, None, 3) for i in range(total)]
    good, bad = Rival(4, 1.5, 0.05), Rival(7, 1.6, 0.35)
    few = drifts[: MIN_EXAMPLES_TO_DOMINATE - 1]
    assert loss.dominated(weights, total, [good], 0.9, few) is None  # too few examples to judge
    some = drifts[:MIN_EXAMPLES_TO_DOMINATE]
    reason = loss.dominated(weights, total, [bad, good], 0.9, some)
    assert reason is not None and reason.startswith("dominated by trial 4 (1.50x, mean KL 0.0500 nats)")
    assert f"after {MIN_EXAMPLES_TO_DOMINATE} examples" in reason
    assert loss.dominated(weights, total, [bad], 0.9, some) is None  # KL 0.30-0.34 vs 0.35: not beaten
    assert loss.dominated(weights, total, [], 0.9, some) is None  # no rival at least as fast
    assert loss.dominated(weights, total, [good], 0.9, drifts) is None  # complete: not stopped
    with pytest.raises(ValueError, match="must be finite"):
        Rival(1, float("nan"), 0.1)
