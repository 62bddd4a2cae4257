"""The pilot: a search cap for a model with no packaged slope prior, measured on the study's own model.

Without ``--max-kl`` and without a prior for the model (:mod:`tuner.statistics.prior`), the search
cap used to be :data:`tuner.statistics.cap.KL_PER_POINT` nats per point of budget. On a model the
project never saw that constant is a guess: on Qwen2.5-0.5B, half of a quickstart's trials landed
above it (issue 63). Before the study is created, the pilot scores :data:`PILOT` hand-made schedules
(the paper's default progressive schedule and two one-stage schedules, chosen on no data) on the
search's validation examples, their task score and their teacher-forced KL from one unpruned prefill
per example (:meth:`tuner.evaluation.fidelity.FidelityEvaluator.score_together`, which also fills
the unpruned side every trial reads, so little is spent twice). Their pooled slope of task loss on
``KL^p`` through the origin (:func:`tuner.statistics.calibration.fit`, the calibration's own
estimator at ``--calibration-exponent``) gives the cap as a prior's slope would:
:func:`tuner.statistics.cap.pilot_cap`, the KL at which it predicts
:data:`~tuner.statistics.cap.CAP_MARGIN` times the budget. Its point estimate is used, not a bound:
the cap only steers exploration, and the decision is still the study's calibration at the end.

Where the pilot measures no cost of KL (its slope is 0 or below: answers that did not change, or
too few examples), the constant stays, as the last resort, and the report says so. The pilot runs
once per study: what it measured is stored with the study (user attr :data:`PILOT_ATTR`), and a
resumed run or another worker on the same storage reads it back (:func:`stored_pilot`) rather than
measure again. Measuring again would cost the pilot's prefills each time, and on other hardware or
another thread count low-precision forwards are not bit-stable, so a cap measured again could differ
in its last digits from the one in the study's identity and refuse the worker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from lazyllm.engine import LazyLLM
from lazyllm.schedule import Schedule
from tuner.evaluation.fidelity import FidelityEvaluator
from tuner.statistics.bootstrap import macro_weights
from tuner.statistics.calibration import ScoredSchedule, fit
from tuner.statistics.cap import SearchCap, pilot_cap
from tuner.study.settings import SearchSettings

PILOT = ("paper-style", "one-stage keep=50% after a quarter", "one-stage keep=30% after half")
"""The pilot's schedules, by name (:func:`pilot_schedules`)."""

PILOT_ATTR = "pilot"
"""The study's user attr holding :meth:`PilotResult.to_dict`, written when the study is created."""


def pilot_schedules(model_name: str, layers: int) -> dict[str, Schedule]:
    """The :data:`PILOT` schedules of a ``layers``-deep model: they span little to much drift."""
    quarter, half = max(1, layers // 4), max(1, layers // 2)
    return dict(
        zip(
            PILOT,
            (
                Schedule.paper_style(model_name, layers),
                Schedule.from_layers(model_name, layers, {quarter: 50}),
                Schedule.from_layers(model_name, layers, {half: 70}),
            ),
        )
    )


@dataclass(frozen=True)
class PilotResult:
    """What the pilot measured and the cap it set.

    Attributes:
        cap: the search cap (source ``pilot``), or None: no cost of KL measured (the constant stays).
        slope: the pooled slope (points per nat^``exponent``; None: no schedule drifted).
        points: ``(name, mean KL in nats, mean task loss in points)`` per schedule.
        n: validation examples each was scored on.
        stored: read back from the study (:func:`stored_pilot`), measured when it was created.
    """

    cap: SearchCap | None
    slope: float | None
    points: tuple[tuple[str, float, float], ...]
    n: int
    stored: bool = False

    def text(self) -> str:
        """One line for the console and the report."""
        seen = "; ".join(
            f"{name}: KL {kl:.4f} nats, task loss {loss:.2f} points" for name, kl, loss in self.points
        )
        when = " (read from the study: measured when it was created)" if self.stored else ""
        if self.cap is None:
            return (
                f"pilot on {self.n} validation examples ({seen}): no cost of KL measured, the constant cap "
                f"stays{when}"
            )
        return (
            f"pilot on {self.n} validation examples ({seen}): slope {self.slope:.2f} points per nat^p{when}"
        )

    def to_dict(self) -> dict[str, Any]:
        """What the study stores (:data:`PILOT_ATTR`): the measurement, not the cap, which the budget
        and the calibration's exponent give again (:func:`stored_pilot`)."""
        return {"slope": self.slope, "points": [list(p) for p in self.points], "n": self.n}


def wants_pilot(settings: SearchSettings) -> bool:
    """Whether a study's cap would otherwise be the constant: a fidelity search with a gold budget,
    no ``--max-kl`` and no slope prior for its model."""
    cap = settings.cap
    return cap is not None and cap.source == "constant" and settings.budget_kind == "gold"


def run_pilot(
    settings: SearchSettings, model: Any, tokenizer: Any, fidelity: FidelityEvaluator
) -> PilotResult:
    """Score the :data:`PILOT` schedules on ``fidelity``'s examples (the search's) and derive the cap."""
    layers = int(model.config.num_hidden_layers)
    schedules = pilot_schedules(settings.model, layers)
    engines = {
        i: LazyLLM(
            model, s.with_revival(settings.revival_policy), tokenizer=tokenizer, strict_model_name=False
        )
        for i, s in enumerate(schedules.values())
    }
    scored = fidelity.score_together(engines, kl=True, desc=f"pilot: {len(engines)} hand-made schedules")
    examples = fidelity.evaluator.examples
    weights = dict(zip((e.key for e in examples), macro_weights([e.dataset for e in examples])))
    base = {(b.dataset, b.record_id): b.score for b in fidelity.evaluator.baseline_results()}
    evidence = []
    points = []
    norm = sum(weights.values())
    for i, name in enumerate(schedules):
        results, drifts = scored[i]
        task = {
            f"{r.dataset}/{r.record_id}": 100.0 * (base[(r.dataset, r.record_id)] - r.score) for r in results
        }
        kl = {f"{d.dataset}/{d.record_id}": d.kl for d in drifts}
        evidence.append(ScoredSchedule(i, kl, task))
        points.append(
            (
                name,
                sum(weights[k] * v for k, v in kl.items()) / norm,
                sum(weights[k] * v for k, v in task.items()) / norm,
            )
        )
    calibration = fit(
        evidence, weights, level=settings.decision_level, confidence=settings.confidence,
        exponent=settings.calibration_exponent,
    )  # fmt: skip
    slope = None if calibration is None else calibration.slope
    return PilotResult(_cap(settings, slope), slope, tuple(points), len(examples))


def _cap(settings: SearchSettings, slope: float | None) -> SearchCap | None:
    """The cap a pilot's slope gives under ``settings`` (None where no schedule drifted)."""
    if slope is None:
        return None
    return pilot_cap(settings.max_accuracy_loss, slope, settings.calibration_exponent)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def stored_pilot(settings: SearchSettings, storage: optuna.storages.BaseStorage) -> PilotResult | None:
    """The pilot the study ``settings.name`` stored when it was created, with the cap it gives under
    ``settings`` (the same as then unless the budget or the exponent changed, which the study's
    identity then refuses); None where there is no such study, or it stored no pilot (then the pilot
    runs)."""
    try:
        study_id = storage.get_study_id_from_name(settings.name)
    except KeyError:
        return None
    data = storage.get_study_user_attrs(study_id).get(PILOT_ATTR)
    if not isinstance(data, Mapping):
        return None
    slope, points, n = data.get("slope"), data.get("points"), data.get("n")
    if not (slope is None or _number(slope)) or not isinstance(points, list):
        return None
    if isinstance(n, bool) or not isinstance(n, int):
        return None
    rows = [tuple(p) for p in points if isinstance(p, list) and len(p) == 3]
    if len(rows) != len(points) or not all(
        isinstance(a, str) and _number(b) and _number(c) for a, b, c in rows
    ):
        return None
    measured = tuple((str(a), float(b), float(c)) for a, b, c in rows)
    stored = None if slope is None else float(slope)
    return PilotResult(_cap(settings, stored), stored, measured, n, stored=True)
