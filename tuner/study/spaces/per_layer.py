"""The ``per_layer`` space: one percentile per layer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from optuna.trial import BaseTrial

from lazyllm.schedule import Schedule
from lazyllm.scoring import Scoring
from tuner.study.spaces.base import (
    SearchSpace,
    check_num_layers,
    check_step,
    float_field,
    paper_reference,
    snap,
)


@dataclass(frozen=True, kw_only=True)
class PerLayerSpace(SearchSpace):
    """One percentile per layer: ``layer{l}_pct`` in ``[0, pct_high]`` for ``l`` in ``0..L-2``.

    Args:
        pct_high: the highest percentile of any layer, in ``(0, 100)``.
        pct_step: the grid of percentiles, or ``None`` for a continuous range.
    """

    kind: ClassVar[str] = "per_layer"

    pct_high: float = 60.0
    pct_step: float | None = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        high = float_field("pct_high", self.pct_high)
        if not 0.0 < high <= 99.0:
            raise ValueError(f"pct_high = {self.pct_high!r}: must be in (0, 99] (a prune percentile)")
        object.__setattr__(self, "pct_high", high)
        object.__setattr__(self, "pct_step", check_step("pct_step", self.pct_step, 0.0, high))

    def suggest_params(self, trial: BaseTrial, num_layers: int) -> dict[str, Any]:
        return {
            f"layer{layer}_pct": trial.suggest_float(
                f"layer{layer}_pct", 0.0, self.pct_high, step=self.pct_step
            )
            for layer in range(num_layers - 1)
        }

    def to_schedule(self, params: Mapping[str, Any], model: str, num_layers: int) -> Schedule:
        check_num_layers(num_layers)
        used = {
            f"layer{layer}_pct": self._float_param(
                params, f"layer{layer}_pct", 0.0, self.pct_high, num_layers
            )
            for layer in range(num_layers - 1)
        }
        values = (*used.values(), 0.0)
        return self._schedule(model, values, used, params)

    def warm_start(self, num_layers: int) -> list[dict[str, Any]]:
        """The paper-style percentiles clipped and rounded to the grid, then the families, the peers and
        the one-stage hand-made family, as in the other spaces (keep-all is the study's reference trial)."""
        check_num_layers(num_layers)
        paper = paper_reference(num_layers)
        point = {
            f"layer{layer}_pct": snap(paper.percentiles[layer], 0.0, self.pct_high, self.pct_step)
            for layer in range(num_layers - 1)
        }
        rule = Scoring()
        points = [
            self._with_rule(point, rule),
            *self.family_starts(num_layers),
            *self.peer_starts(num_layers),
        ]
        return [*points, *self.hand_made_starts(num_layers, points)]

    def _one_stage(self, layer: int, keep: float, num_layers: int) -> dict[str, Any]:
        pct = snap(100.0 * (1.0 - keep), 0.0, self.pct_high, self.pct_step)
        return {f"layer{i}_pct": pct if i == layer else 0.0 for i in range(num_layers - 1)}
