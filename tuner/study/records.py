"""One typed record per trial, from sampling to report: the schedule it evaluated, what the search
measured with its uncertainty, and provenance.

A trial stores exactly one user attr, ``"record"`` (:data:`RECORD_ATTR`, plain JSON, versioned);
Optuna keeps its own values, params and constraints beside it. Every stage after the trial (front,
confirmation, held-out check, report, MLflow, the registry) reads :meth:`TrialRecord.from_trial` and
nothing else. Studies made by earlier versions (loose user attrs ``percentiles``, ``revival``, a
version-1 record without the schedule) are read by the same loader, :meth:`TrialRecord.from_trial`;
nothing writes the old forms.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from lazyllm.schedule import Revival, Schedule
from tuner.statistics.bootstrap import Estimate
from tuner.statistics.speed import SpeedMeasurement
from tuner.study.settings import ACCURACY_MODES

RECORD_ATTR = "record"
RECORD_VERSION = 2


def complete_trial_count(study: optuna.Study) -> int:
    """How many of ``study``'s trials are COMPLETE: what a judgement stored in the study (the
    confirmation, the front at the target length) was made on, and valid while it is unchanged."""
    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def schedule_key(schedule: Schedule) -> str:
    """What makes two schedules compute differently: every field but the free-form metadata; for a
    schedule that prunes nothing, only the model and depth (no token is scored or revived)."""
    data = schedule.to_dict()
    data.pop("metadata", None)
    if not schedule.prunes:
        data = {k: data[k] for k in ("model", "num_layers", "percentiles") if k in data}
    return json.dumps(data, sort_keys=True)


@dataclass(frozen=True)
class TrialRecord:
    """A finished trial (complete, or stopped early).

    Attributes:
        number: Optuna trial number.
        schedule: the schedule evaluated, revival policy (and every other field) included.
        params: the search-space parameters.
        accuracy: the loss kind (:data:`tuner.evaluation.losses.LOSSES`): ``"fidelity"`` (nats) or ``"score"``.
        flop_speedup: FLOP-model prefill speedup at the study's mean prompt length.
        prompt_computed_pct: share of prompt (token, layer) pairs a prefill computes, percent.
        examples_run: validation examples evaluated.
        loss: the accuracy loss over the validation examples (None when stopped early).
        speedup: the speed objective (measured TTFT, whole generation, or FLOP model, per the study's
            ``speedup``); None when stopped early.
        speed: the robust timing behind ``speedup`` (None with ``speedup="flops"``).
        stopped: why the trial stopped early (PRUNED), if it did.
        metrics: other numbers (``top1``, ``gold_delta``, ``score``, ``baseline_score``...).
        per_dataset: the loss per dataset.
        per_example: the loss per example key (``dataset/record_id``), what intervals are made from.
        provenance: model, task, seed, sampler, versions, wall time.
        duplicate_of: for studies made before duplicates were refused: the trial whose values it reused.
    """

    number: int
    schedule: Schedule
    params: dict[str, Any]
    accuracy: str
    flop_speedup: float
    prompt_computed_pct: float
    examples_run: int = 0
    loss: Estimate | None = None
    speedup: float | None = None
    speed: SpeedMeasurement | None = None
    stopped: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    per_dataset: dict[str, float] = field(default_factory=dict)
    per_example: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    duplicate_of: int | None = None

    def __post_init__(self) -> None:
        if self.accuracy not in ACCURACY_MODES:
            raise ValueError(f"accuracy = {self.accuracy!r}: must be one of {', '.join(ACCURACY_MODES)}")
        if self.stopped is None:
            if self.loss is None or self.speedup is None:
                raise ValueError(f"trial {self.number}: a complete record needs its loss and speedup")
            if not (math.isfinite(self.speedup) and self.speedup > 0):
                raise ValueError(f"trial {self.number}: speedup = {self.speedup} must be finite and > 0")
        elif self.loss is not None or self.speedup is not None:
            raise ValueError(f"trial {self.number}: a record stopped early has no loss or speedup")

    @property
    def complete(self) -> bool:
        return self.stopped is None

    @property
    def values(self) -> tuple[float, float]:
        """The two objectives ``(speedup, loss)`` of a complete record."""
        if self.loss is None or self.speedup is None:
            raise ValueError(f"trial {self.number} stopped early ({self.stopped}): it has no values")
        return self.speedup, self.loss.value

    def flat_metrics(self) -> dict[str, float]:
        """Every number as one flat ``name -> float`` map (MLflow metrics, tables)."""
        out: dict[str, float | None] = {
            "flop_speedup": self.flop_speedup,
            "prompt_computed_pct": self.prompt_computed_pct,
            "examples_run": float(self.examples_run),
            "wall_time_s": self.provenance.get("wall_time_s"),
            **self.metrics,
            **{f"loss.{d}": v for d, v in self.per_dataset.items()},
        }
        if self.loss is not None and self.speedup is not None:
            out |= {
                "speedup": self.speedup,
                "accuracy_loss": self.loss.value,
                "accuracy_loss_se": self.loss.se,
                "accuracy_loss_low": self.loss.low,
                "accuracy_loss_high": self.loss.high,
                "accuracy_loss_upper": self.loss.upper,
            }
        if self.speed is not None:
            out["measured_speedup"] = self.speed.speedup
            out["speed_ratio_to_flops"] = self.speed.ratio_to_flops
            out["speed_spread_baseline"] = self.speed.spread["baseline"]
            out["speed_spread_schedule"] = self.speed.spread["schedule"]
        return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "number": self.number,
            "schedule": self.schedule.to_dict(),
            "params": self.params,
            "accuracy": self.accuracy,
            "flop_speedup": self.flop_speedup,
            "prompt_computed_pct": self.prompt_computed_pct,
            "examples_run": self.examples_run,
            "loss": None if self.loss is None else self.loss.to_dict(),
            "speedup": self.speedup,
            "speed": None if self.speed is None else self.speed.to_dict(),
            "stopped": self.stopped,
            "metrics": self.metrics,
            "per_dataset": self.per_dataset,
            "per_example": self.per_example,
            "provenance": self.provenance,
            "duplicate_of": self.duplicate_of,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], schedule: Schedule | None = None) -> TrialRecord:
        """A record from :meth:`to_dict`'s form; ``schedule`` stands in for version-1 records, which
        did not hold their schedule."""
        speed, loss = data.get("speed"), data.get("loss")
        if schedule is None:
            schedule = Schedule.from_dict(data["schedule"])
        return cls(
            number=int(data["number"]),
            schedule=schedule,
            params=dict(data.get("params", {})),
            accuracy=str(data["accuracy"]),
            flop_speedup=float(data["flop_speedup"]),
            prompt_computed_pct=float(data["prompt_computed_pct"]),
            examples_run=int(data.get("examples_run", len(data.get("per_example", {})))),
            loss=None if loss is None else Estimate.from_dict(loss),
            speedup=None if data.get("speedup") is None else float(data["speedup"]),
            speed=None if speed is None else SpeedMeasurement.from_dict(speed),
            stopped=data.get("stopped"),
            metrics={k: float(v) for k, v in data.get("metrics", {}).items()},
            per_dataset={k: float(v) for k, v in data.get("per_dataset", {}).items()},
            per_example={k: float(v) for k, v in data.get("per_example", {}).items()},
            provenance=dict(data.get("provenance", {})),
            duplicate_of=None if data.get("duplicate_of") is None else int(data["duplicate_of"]),
        )

    def store(self, trial: Any) -> None:
        """Write this record as the trial's one user attr."""
        trial.set_user_attr(RECORD_ATTR, self.to_dict())

    @classmethod
    def from_trial(cls, trial: FrozenTrial, model: str = "unknown") -> TrialRecord | None:
        """The record of a finished trial; None for a trial that never evaluated a schedule (failed,
        surplus, refused as a duplicate, running).

        The one loader of every study format: version-2 records hold their schedule; version-1
        records (and studies older than records) kept the schedule as user attrs ``percentiles`` and
        ``revival`` (``dynamic`` before revival was recorded) and ``model`` names its model.
        """
        if trial.state not in (TrialState.COMPLETE, TrialState.PRUNED):
            return None
        attrs = trial.user_attrs
        data = attrs.get(RECORD_ATTR)
        if isinstance(data, dict) and "schedule" in data:
            return cls.from_dict(data)
        if "percentiles" not in attrs and not isinstance(data, dict):
            return None
        percentiles = data["percentiles"] if isinstance(data, dict) else attrs["percentiles"]
        schedule = Schedule(
            model=model,
            percentiles=tuple(float(p) for p in percentiles),
            revival=Revival.parse(str(attrs.get("revival", "dynamic"))),
        )
        duplicate = attrs.get("duplicate_of")
        if isinstance(data, dict):
            record = cls.from_dict(data, schedule)
            return (
                record
                if duplicate is None
                else dataclasses.replace(record, number=trial.number, duplicate_of=int(duplicate))
            )
        return cls._from_loose_attrs(trial, schedule, None if duplicate is None else int(duplicate))

    @classmethod
    def _from_loose_attrs(
        cls, trial: FrozenTrial, schedule: Schedule, duplicate_of: int | None
    ) -> TrialRecord:
        """Studies from before trial records: the values Optuna kept and the loose attrs."""
        attrs = trial.user_attrs
        flops = float(attrs.get("flop_speedup", trial.values[0] if trial.values else 1.0))
        computed = float(attrs.get("prompt_computed_pct", float("nan")))
        common: dict[str, Any] = {
            "number": trial.number,
            "schedule": schedule,
            "params": dict(trial.params),
            "accuracy": "score",
            "flop_speedup": flops,
            "prompt_computed_pct": computed,
            "examples_run": int(attrs.get("examples_run", 0)),
            "duplicate_of": duplicate_of,
        }
        if trial.state == TrialState.PRUNED or not trial.values:
            return cls(**common, stopped=str(attrs.get("stopped_early") or "stopped early"))
        interval = attrs.get("accuracy_loss_interval") or [trial.values[1], trial.values[1]]
        upper = attrs.get("accuracy_loss_upper", trial.values[1])
        se = attrs.get("accuracy_loss_se")
        loss = Estimate(
            value=float(trial.values[1]),
            se=math.inf if se is None else float(se),
            low=float(interval[0]),
            high=float(interval[1]),
            upper=float(upper),
            level=0.9,
            n=max(1, int(attrs.get("examples_run", 1))),
        )
        return cls(**common, loss=loss, speedup=float(trial.values[0]))
