"""One typed record per trial: what the search measured, with its uncertainty and provenance.

A study writes a :class:`TrialRecord` into the trial's user attrs (key ``"record"``, plain JSON) and
every reader (export, MLflow tracking, the confirmation stage, the held-out report) rebuilds it with
:meth:`TrialRecord.from_trial` instead of picking string keys out of the attrs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial

from tuner.settings import ACCURACY_MODES
from tuner.speed import SpeedMeasurement
from tuner.stats import Estimate

RECORD_ATTR = "record"
LOSS_UNITS = {"fidelity": "nats (mean KL per answer token)", "score": "score points"}


@dataclass(frozen=True)
class TrialRecord:
    """A finished trial.

    Attributes:
        number: Optuna trial number.
        percentiles: the schedule evaluated (one prune percentile per layer).
        params: the search-space parameters.
        accuracy: ``"fidelity"`` (loss = mean KL, nats) or ``"score"`` (loss = LongBench points).
        speedup: the speed objective (measured TTFT or FLOP model, per the study's ``speedup``).
        loss: the accuracy objective, an :class:`~tuner.stats.Estimate` over the validation examples.
        flop_speedup: FLOP-model prefill speedup at the study's mean prompt length.
        prompt_computed_pct: share of prompt (token, layer) pairs a prefill computes.
        speed: the robust TTFT measurement (None with ``speedup="flops"``).
        metrics: other per-trial numbers (``top1``, ``gold_delta``, ``score``, ``baseline_score``...).
        per_dataset: the loss per dataset.
        per_example: the loss per example key (``dataset/record_id``), what intervals are made from.
        provenance: model, task, seed, sampler, versions, wall time.
    """

    number: int
    percentiles: tuple[float, ...]
    params: dict[str, Any]
    accuracy: str
    speedup: float
    loss: Estimate
    flop_speedup: float
    prompt_computed_pct: float
    speed: SpeedMeasurement | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    per_dataset: dict[str, float] = field(default_factory=dict)
    per_example: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.accuracy not in ACCURACY_MODES:
            raise ValueError(f"accuracy = {self.accuracy!r}: must be one of {', '.join(ACCURACY_MODES)}")
        if not (math.isfinite(self.speedup) and self.speedup > 0):
            raise ValueError(f"trial {self.number}: speedup = {self.speedup} must be finite and > 0")
        if not self.percentiles:
            raise ValueError(f"trial {self.number}: empty schedule")

    def feasible(self, budget: float) -> bool:
        """Confidently within budget: the one-sided upper bound of the loss is at most ``budget``."""
        return self.loss.upper <= budget

    def flat_metrics(self) -> dict[str, float]:
        """Every number as one flat ``name -> float`` map (MLflow metrics, tables)."""
        out = {
            "speedup": self.speedup,
            "accuracy_loss": self.loss.value,
            "accuracy_loss_se": self.loss.se,
            "accuracy_loss_low": self.loss.low,
            "accuracy_loss_high": self.loss.high,
            "accuracy_loss_upper": self.loss.upper,
            "flop_speedup": self.flop_speedup,
            "prompt_computed_pct": self.prompt_computed_pct,
            **self.metrics,
            **{f"loss.{d}": v for d, v in self.per_dataset.items()},
        }
        if self.speed is not None:
            out["measured_ttft_speedup"] = self.speed.speedup
            out["speed_ratio_to_flops"] = self.speed.ratio_to_flops
            out["speed_spread_baseline"] = self.speed.spread["baseline"]
            out["speed_spread_schedule"] = self.speed.spread["schedule"]
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "percentiles": list(self.percentiles),
            "params": self.params,
            "accuracy": self.accuracy,
            "speedup": self.speedup,
            "loss": self.loss.to_dict(),
            "flop_speedup": self.flop_speedup,
            "prompt_computed_pct": self.prompt_computed_pct,
            "speed": None if self.speed is None else _speed_dict(self.speed),
            "metrics": self.metrics,
            "per_dataset": self.per_dataset,
            "per_example": self.per_example,
            "provenance": self.provenance,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        speed = data.get("speed")
        return cls(
            number=int(data["number"]),
            percentiles=tuple(float(p) for p in data["percentiles"]),
            params=dict(data["params"]),
            accuracy=str(data["accuracy"]),
            speedup=float(data["speedup"]),
            loss=Estimate.from_dict(data["loss"]),
            flop_speedup=float(data["flop_speedup"]),
            prompt_computed_pct=float(data["prompt_computed_pct"]),
            speed=None
            if speed is None
            else SpeedMeasurement(
                speedup=float(speed["speedup"]),
                flop_speedup=float(speed["flop_speedup"]),
                baseline_s=tuple(speed["baseline_s"]),
                schedule_s=tuple(speed["schedule_s"]),
                remeasured=bool(speed["remeasured"]),
                plausible=bool(speed["plausible"]),
                bounds=(float(speed["bounds"][0]), float(speed["bounds"][1])),
                clock=str(speed.get("clock", "wall")),  # records before the CPU clock: wall
            ),
            metrics={k: float(v) for k, v in data.get("metrics", {}).items()},
            per_dataset={k: float(v) for k, v in data.get("per_dataset", {}).items()},
            per_example={k: float(v) for k, v in data.get("per_example", {}).items()},
            provenance=dict(data.get("provenance", {})),
        )

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> TrialRecord | None:
        """The record of a finished trial (None for a trial without one: pruned, failed, older study)."""
        data = trial.user_attrs.get(RECORD_ATTR)
        return None if data is None else cls.from_dict(data)


def _speed_dict(speed: SpeedMeasurement) -> dict[str, Any]:
    return {
        "speedup": speed.speedup,
        "flop_speedup": speed.flop_speedup,
        "baseline_s": list(speed.baseline_s),
        "schedule_s": list(speed.schedule_s),
        "remeasured": speed.remeasured,
        "plausible": speed.plausible,
        "bounds": list(speed.bounds),
        "ratio_to_flops": speed.ratio_to_flops,
        "spread": speed.spread,
    }
