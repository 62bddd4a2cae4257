"""The ``parametric`` space: four numbers that always reach the chosen final keep fraction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from optuna.trial import BaseTrial

from lazyllm.schedule import Schedule
from lazyllm.scoring import Scoring
from tuner.study.spaces.base import (
    MIN_FINAL_KEEP,
    PAPER_FINAL_KEEP,
    PAPER_STAGES,
    SHAPES,
    SearchSpace,
    check_num_layers,
    check_range,
    depth_to_layer,
    float_field,
    int_field,
    shape_shares,
    snap,
)


@dataclass(frozen=True, kw_only=True)
class ParametricSpace(SearchSpace):
    """A low-dimensional family of progressive schedules that always keeps ``final_keep`` in the end.

    Parameters: ``start_depth`` (float), ``final_keep`` (float), ``n_stages`` (int) and ``shape``
    (categorical, one of :data:`SHAPES`). The schedule:

    * the first stage prunes after layer ``s = depth_to_layer(start_depth, L)``; there are
      ``n = min(n_stages, L - 1 - s)`` stages, at layers ``s + round(i * (L - 2 - s) / max(n - 1, 1))``
      for ``i < n`` (evenly spaced from ``s`` to ``L - 2``, as ``Schedule.progressive``);
    * stage ``i`` keeps a fraction ``k_i = final_keep ** w_i`` of the active tokens, where the shares
      ``w_i`` (summing to 1) come from :func:`shape_shares`: equal for ``even`` (equal percentiles),
      ``ratio ** (n - 1 - i)`` for ``front`` (more pruning early) and ``ratio ** i`` for ``back`` (more
      pruning late), with ``ratio = shape_ratio``. Its percentile is ``100 * (1 - k_i)``.

    So the keep fraction at the last layer is ``prod_i k_i = final_keep`` for every shape.

    Args:
        start_depth_low, start_depth_high: range of ``start_depth``, fractions of depth in ``[0, 1]``.
        final_keep_low, final_keep_high: range of ``final_keep``, in ``[0.001, 1]`` (1 is keep-all).
        n_stages_low, n_stages_high: range of ``n_stages``, ``>= 1``.
        shapes: the shapes to choose from, a non-empty subset of :data:`SHAPES`.
        shape_ratio: the geometric ratio of ``front`` and ``back``, ``> 1``.
    """

    kind: ClassVar[str] = "parametric"

    start_depth_low: float
    start_depth_high: float
    final_keep_low: float
    final_keep_high: float
    n_stages_low: int
    n_stages_high: int
    shapes: tuple[str, ...] = SHAPES
    shape_ratio: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in (
            "start_depth_low",
            "start_depth_high",
            "final_keep_low",
            "final_keep_high",
            "shape_ratio",
        ):
            object.__setattr__(self, key, float_field(key, getattr(self, key)))
        check_range(
            "start_depth_low",
            self.start_depth_low,
            "start_depth_high",
            self.start_depth_high,
            0.0,
            1.0,
            "a fraction of depth",
        )
        check_range(
            "final_keep_low",
            self.final_keep_low,
            "final_keep_high",
            self.final_keep_high,
            MIN_FINAL_KEEP,
            1.0,
            "the share of the prompt reaching the last layer",
        )
        low, high = (
            int_field("n_stages_low", self.n_stages_low),
            int_field("n_stages_high", self.n_stages_high),
        )
        if low < 1:
            raise ValueError(f"n_stages_low = {low!r}: must be >= 1 (use final_keep = 1 for keep-all)")
        if low > high:
            raise ValueError(f"n_stages_low = {low!r} is above n_stages_high = {high!r}: swap them")
        if isinstance(self.shapes, str) or not isinstance(self.shapes, (list, tuple)) or not self.shapes:
            raise ValueError(f"shapes = {self.shapes!r}: must be a non-empty list from {list(SHAPES)}")
        for shape in self.shapes:
            if shape not in SHAPES:
                raise ValueError(f"shapes = {self.shapes!r}: {shape!r} is not one of {list(SHAPES)}")
        if len(set(self.shapes)) != len(self.shapes):
            raise ValueError(f"shapes = {self.shapes!r}: remove the repeated shape")
        if self.shape_ratio <= 1.0:
            raise ValueError(
                f"shape_ratio = {self.shape_ratio!r}: must be > 1 (1 would make all shapes even)"
            )
        object.__setattr__(self, "shapes", tuple(self.shapes))

    def suggest_params(self, trial: BaseTrial, num_layers: int) -> dict[str, Any]:
        return {
            "start_depth": trial.suggest_float("start_depth", self.start_depth_low, self.start_depth_high),
            "final_keep": trial.suggest_float("final_keep", self.final_keep_low, self.final_keep_high),
            "n_stages": trial.suggest_int("n_stages", self.n_stages_low, self.n_stages_high),
            "shape": trial.suggest_categorical("shape", list(self.shapes)),
        }

    def to_schedule(self, params: Mapping[str, Any], model: str, num_layers: int) -> Schedule:
        check_num_layers(num_layers)
        used: dict[str, Any] = {
            "start_depth": self._float_param(
                params, "start_depth", self.start_depth_low, self.start_depth_high, num_layers
            ),
            "final_keep": self._float_param(
                params, "final_keep", self.final_keep_low, self.final_keep_high, num_layers
            ),
            "n_stages": self._int_param(
                params, "n_stages", self.n_stages_low, self.n_stages_high, num_layers
            ),
            "shape": self._param(params, "shape"),
        }
        if used["shape"] not in self.shapes:
            raise ValueError(
                f"params['shape'] = {used['shape']!r}: must be one of {list(self.shapes)} "
                f"(search space {self.name!r})"
            )
        start = depth_to_layer(used["start_depth"], num_layers)
        span = num_layers - 1 - start
        n = min(used["n_stages"], span)
        layers = [start + round(i * (span - 1) / max(n - 1, 1)) for i in range(n)]
        keep = [1.0] * num_layers
        for layer, share in zip(layers, shape_shares(used["shape"], n, self.shape_ratio)):
            keep[layer] *= used["final_keep"] ** share
        values = tuple(100.0 * (1.0 - k) for k in keep)
        return self._schedule(model, values, used, params)

    def warm_start(self, num_layers: int) -> list[dict[str, Any]]:
        """The paper-style point: start at mid-depth, keep 0.3, 4 stages, ``even`` (each clipped to its
        range), then the families, the peers and the one-stage hand-made family, as in the other
        spaces (keep-all is the study's reference trial)."""
        check_num_layers(num_layers)
        paper_start = min(num_layers // 2, num_layers - 2) / (num_layers - 1)
        points = [
            {
                "start_depth": snap(paper_start, self.start_depth_low, self.start_depth_high, None),
                "final_keep": snap(PAPER_FINAL_KEEP, self.final_keep_low, self.final_keep_high, None),
                "n_stages": min(max(PAPER_STAGES, self.n_stages_low), self.n_stages_high),
                "shape": "even" if "even" in self.shapes else self.shapes[0],
            }
        ]
        queued = [
            *(self._with_rule(p, Scoring()) for p in points),
            *self.family_starts(num_layers),
            *self.peer_starts(num_layers),
        ]
        return [*queued, *self.hand_made_starts(num_layers, queued)]

    def _one_stage(self, layer: int, keep: float, num_layers: int) -> dict[str, Any]:
        return {
            "start_depth": snap(layer / (num_layers - 1), self.start_depth_low, self.start_depth_high, None),
            "final_keep": snap(keep, self.final_keep_low, self.final_keep_high, None),
            "n_stages": self.n_stages_low,
            "shape": "even" if "even" in self.shapes else self.shapes[0],
        }
