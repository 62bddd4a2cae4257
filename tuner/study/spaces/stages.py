"""The ``stages`` space: up to ``max_stages`` pruning layers, each a layer and a percentile."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from optuna.trial import BaseTrial

from lazyllm.schedule import Schedule
from lazyllm.scoring import Scoring
from tuner.study.spaces.base import (
    PAPER_FINAL_KEEP,
    PAPER_STAGES,
    SearchSpace,
    check_num_layers,
    check_range,
    check_step,
    compose_percentiles,
    depth_to_layer,
    float_field,
    int_field,
    paper_reference,
    snap,
)


@dataclass(frozen=True, kw_only=True)
class StagesSpace(SearchSpace):
    """Up to ``max_stages`` pruning stages, each a layer and a percentile.

    Parameters: ``n_stages`` in ``1..max_stages`` when sampled; for each stage ``i < n_stages``,
    ``stage{i}_layer`` (an integer layer in :meth:`layer_range`) and ``stage{i}_pct`` (in
    ``[pct_low, pct_high]``, on the ``pct_step`` grid if set). ``n_stages = 0`` is keep-all: it reads
    back (:meth:`to_schedule`, studies stored before), but the sampler never proposes it, since the
    study evaluates keep-all once as its reference trial and a sampler that models ``n_stages = 0``
    keeps proposing that non-dominated point (every proposal a refused duplicate). Stages on the same
    layer compose multiplicatively (:func:`compose_percentiles`, capped at :data:`MAX_COMPOSED_PCT`).

    Args:
        max_stages: the most stages a schedule may have (>= 1).
        min_depth: earliest pruning layer as a fraction of depth (see :func:`depth_to_layer`).
        pct_low, pct_high: the range of each stage's percentile, ``0 <= pct_low <= pct_high < 100``.
        pct_step: the grid of percentiles, or ``None`` for a continuous range.
    """

    kind: ClassVar[str] = "stages"

    max_stages: int = 4
    min_depth: float = 0.0
    pct_low: float = 10.0
    pct_high: float = 90.0
    pct_step: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if int_field("max_stages", self.max_stages) < 1:
            raise ValueError(f"max_stages = {self.max_stages!r}: must be >= 1 (0 stages is always included)")
        min_depth = float_field("min_depth", self.min_depth)
        if not 0.0 <= min_depth <= 1.0:
            raise ValueError(f"min_depth = {self.min_depth!r}: must be a fraction of depth in [0, 1]")
        low, high = float_field("pct_low", self.pct_low), float_field("pct_high", self.pct_high)
        check_range("pct_low", low, "pct_high", high, 0.0, 99.0, "a prune percentile")
        if high <= 0:
            raise ValueError(f"pct_high = {self.pct_high!r}: must be > 0, or the space cannot prune")
        object.__setattr__(self, "min_depth", min_depth)
        object.__setattr__(self, "pct_low", low)
        object.__setattr__(self, "pct_high", high)
        object.__setattr__(self, "pct_step", check_step("pct_step", self.pct_step, low, high))

    def layer_range(self, num_layers: int) -> tuple[int, int]:
        """The layers a stage may prune after: ``depth_to_layer(min_depth, L) .. L-2``."""
        return depth_to_layer(self.min_depth, num_layers), num_layers - 2

    def suggest_params(self, trial: BaseTrial, num_layers: int) -> dict[str, Any]:
        low, high = self.layer_range(num_layers)
        params: dict[str, Any] = {"n_stages": trial.suggest_int("n_stages", 1, self.max_stages)}
        for i in range(params["n_stages"]):
            params[f"stage{i}_layer"] = trial.suggest_int(f"stage{i}_layer", low, high)
            params[f"stage{i}_pct"] = trial.suggest_float(
                f"stage{i}_pct", self.pct_low, self.pct_high, step=self.pct_step
            )
        return params

    def to_schedule(self, params: Mapping[str, Any], model: str, num_layers: int) -> Schedule:
        check_num_layers(num_layers)
        low, high = self.layer_range(num_layers)
        used: dict[str, Any] = {
            "n_stages": self._int_param(params, "n_stages", 0, self.max_stages, num_layers)
        }
        by_layer: dict[int, list[float]] = {}
        for i in range(used["n_stages"]):
            layer = self._int_param(params, f"stage{i}_layer", low, high, num_layers)
            pct = self._float_param(params, f"stage{i}_pct", self.pct_low, self.pct_high, num_layers)
            used[f"stage{i}_layer"], used[f"stage{i}_pct"] = layer, pct
            by_layer.setdefault(layer, []).append(pct)
        values = [0.0] * num_layers
        for layer, pcts in by_layer.items():
            values[layer] = compose_percentiles(pcts)
        return self._schedule(model, tuple(values), used, params)

    def warm_start(self, num_layers: int) -> list[dict[str, Any]]:
        """The paper-style stages with layers clipped to :meth:`layer_range` and percentiles clipped and
        rounded to the range and grid (today's rule; the paper's recipe), then the families
        (:meth:`family_starts`: one stage at mid depth, the progressive recipe from a quarter of depth),
        then the peers at their published settings (:meth:`SearchSpace.peer_starts`), then the
        one-stage hand-made family (:meth:`SearchSpace.hand_made_starts`)."""
        check_num_layers(num_layers)
        point = self._stages_of(paper_reference(num_layers, self.max_stages), num_layers)
        points: list[dict[str, Any]] = []
        for p in (
            self._with_rule(point, Scoring()),
            *self.family_starts(num_layers),
            *self.peer_starts(num_layers),
        ):
            if p not in points:  # on a shallow model two recipes can be one point
                points.append(p)
        return [*points, *self.hand_made_starts(num_layers, points)]

    def family_starts(self, num_layers: int) -> list[dict[str, Any]]:
        """One stage at mid depth pruning half (a hand-made point, chosen on no data), then the
        paper-style recipe started at a quarter of depth, keeping 30% (the held-out check's ``paper
        start=L/4 keep=0.3``): of the recorded 2048-token open-QA grid, the fastest schedule within a
        2-point budget on its **validation** split, whose questions no test split holds
        (docs/tuning.md#warm-starts). No warm start was chosen on test data."""
        points = super().family_starts(num_layers)
        start = num_layers // 4
        stages = max(1, min(PAPER_STAGES, self.max_stages, num_layers - 1 - start))
        quarter = Schedule.progressive(
            "m", num_layers, start_layer=start, final_keep=PAPER_FINAL_KEEP, stages=stages
        )
        point = self._with_rule(self._stages_of(quarter, num_layers), Scoring())
        if point["n_stages"] > 0 and point not in points:
            points.append(point)
        return points

    def _stages_of(self, schedule: Schedule, num_layers: int) -> dict[str, Any]:
        """``schedule``'s pruning layers as stages of this space: layers clipped to :meth:`layer_range`,
        percentiles clipped and rounded to the range and grid, at most :attr:`max_stages`."""
        low, high = self.layer_range(num_layers)
        stages = [(layer, p) for layer, p in enumerate(schedule.percentiles) if p > 0][: self.max_stages]
        point: dict[str, Any] = {"n_stages": len(stages)}
        for i, (layer, p) in enumerate(stages):
            point[f"stage{i}_layer"] = min(max(layer, low), high)
            point[f"stage{i}_pct"] = snap(p, self.pct_low, self.pct_high, self.pct_step)
        return point

    def _one_stage(self, layer: int, keep: float, num_layers: int) -> dict[str, Any]:
        low, high = self.layer_range(num_layers)
        return {
            "n_stages": 1,
            "stage0_layer": min(max(layer, low), high),
            "stage0_pct": snap(100.0 * (1.0 - keep), self.pct_low, self.pct_high, self.pct_step),
        }
