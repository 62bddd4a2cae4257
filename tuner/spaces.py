"""Search spaces for LazyLLM schedules: declarative YAML files turned into Optuna define-by-run spaces.

A search space is a YAML file under ``search_spaces/`` (see :data:`SEARCH_SPACE_DIR`), looked up by
name with :func:`load_space` (or given as a path). Its ``kind`` picks one of three spaces:

* ``stages`` (:class:`StagesSpace`): up to ``max_stages`` pruning layers, each a layer and a percentile
  (the paper's progressive idea, with free positions).
* ``parametric`` (:class:`ParametricSpace`): four numbers (start depth, final keep fraction, number of
  stages, curve shape) that always reach the chosen final keep fraction.
* ``per_layer`` (:class:`PerLayerSpace`): one percentile per layer; high-dimensional, for long studies.

Layers are written as **fractions of depth** in the YAML files, so that one file fits models of any
depth: a fraction ``f`` is layer ``round(f * (L - 1))`` of an ``L``-layer model, clamped to
``0..L-2`` (the last layer cannot prune); see :func:`depth_to_layer`.

Every space also searches the **scoring rule** (:class:`~lazyllm.scoring.Scoring`): its YAML field
``scoring`` lists the rules to choose from (aliases such as ``last``, ``fastkv``, ``gemfilter`` or full
spellings such as ``w8-softmax-none-mean``; default ``[last]``, today's rule). With more than one
choice a trial has the categorical parameter ``scoring`` (the canonical spelling); a parameter dict
without it (trials of older studies) means today's rule, ``w1-softmax-none-mean``.

Every space maps a parameter dict to a :class:`~lazyllm.schedule.Schedule` with the pure
:meth:`SearchSpace.to_schedule`; :meth:`SearchSpace.suggest` asks a trial for the parameters and then
calls ``to_schedule``, so a finished trial's ``params`` always rebuild the schedule it ran with.

>>> space = load_space("stages")
>>> space.to_schedule({"n_stages": 1, "stage0_layer": 1, "stage0_pct": 50.0}, "m", 4).percentiles
(0.0, 50.0, 0.0, 0.0)
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml
from optuna.trial import BaseTrial

from lazyllm.peers import PEERS
from lazyllm.schedule import Schedule
from lazyllm.scoring import Scoring
from tuner.handmade import one_stage_points
from tuner.strict_yaml import load_strict

SEARCH_SPACE_DIR = Path(__file__).resolve().parents[1] / "search_spaces"
"""The folder of named search spaces: ``<name>.yaml``."""

SHAPES: tuple[str, ...] = ("even", "front", "back")
"""Curve shapes of :class:`ParametricSpace`."""

MAX_COMPOSED_PCT = 99.0
"""Cap on the percentile of a layer where several stages of :class:`StagesSpace` fall together."""

GENTLE_PEER_KEEP = 0.4
"""Share of the tokens a peer's gentler warm start keeps: twice TSP's and GemFilter's published 0.2,
which were set for 8B models on LongBench's full contexts. On SmolLM2 at 1024 tokens both published
shares drift far past a 2-point budget (validation KL 0.38 and 0.39 nats per token, n=13), while TSP
keeping 0.4 after its layer is the fastest schedule the project measured within that budget on test
(1.48x TTFT, loss 1.31 points [-1.02, 3.62], n=29); see the README."""

_PAPER_FINAL_KEEP = 0.3  # as Schedule.paper_style
_PAPER_STAGES = 4  # as Schedule.paper_style
_MIN_FINAL_KEEP = 0.001
_TOL = 1e-9


# --------------------------------------------------------------------------------------------------
# helpers
def depth_to_layer(depth: float, num_layers: int) -> int:
    """The layer at fraction ``depth`` of a ``num_layers``-layer model: ``round(depth * (L - 1))``,
    clamped to the prunable layers ``0..L-2``.

    >>> depth_to_layer(0.5, 30), depth_to_layer(0.5, 18), depth_to_layer(1.0, 30), depth_to_layer(0.0, 30)
    (14, 8, 28, 0)
    """
    return min(max(round(depth * (num_layers - 1)), 0), num_layers - 2)


def shape_shares(shape: str, n_stages: int, ratio: float) -> list[float]:
    """Share of the total log-keep taken by each of ``n_stages`` stages of a :class:`ParametricSpace`.

    The shares sum to 1 and are proportional to ``1`` (``even``), ``ratio ** (n - 1 - i)`` (``front``:
    each stage prunes ``ratio`` times as much, in log-keep, as the next one) or ``ratio ** i``
    (``back``: the mirror image).

    >>> shape_shares("front", 2, 3.0)
    [0.75, 0.25]
    """
    if shape == "even":
        weights = [1.0] * n_stages
    elif shape == "front":
        weights = [ratio ** (n_stages - 1 - i) for i in range(n_stages)]
    elif shape == "back":
        weights = [ratio**i for i in range(n_stages)]
    else:
        raise ValueError(f"shape = {shape!r}: must be one of {', '.join(SHAPES)}")
    total = sum(weights)
    return [w / total for w in weights]


def compose_percentiles(percentiles: Iterable[float]) -> float:
    """The percentile of one layer that prunes ``percentiles`` one after the other, capped at
    :data:`MAX_COMPOSED_PCT`: keep fractions multiply, ``1 - p/100 = prod_i (1 - p_i/100)``.

    >>> compose_percentiles([50.0, 50.0])
    75.0
    """
    combined = 0.0
    for p in percentiles:
        combined = 100.0 - (100.0 - combined) * (100.0 - p) / 100.0
    return min(combined, MAX_COMPOSED_PCT)


def _check_num_layers(num_layers: int) -> None:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 2:
        raise ValueError(
            f"num_layers = {num_layers!r}: must be an integer >= 2 (the last layer cannot prune, so a "
            "1-layer model has nothing to tune)"
        )


def _paper_reference(num_layers: int, max_stages: int = _PAPER_STAGES) -> Schedule:
    """``Schedule.paper_style`` where the model is deep enough, else the nearest progressive schedule
    (start at mid-depth, at most one stage per remaining prunable layer, at most ``max_stages``)."""
    start = min(num_layers // 2, num_layers - 2)
    stages = min(_PAPER_STAGES, max_stages, num_layers - 1 - start)
    return Schedule.progressive(
        "paper-style", num_layers, start_layer=start, final_keep=_PAPER_FINAL_KEEP, stages=stages
    )


def _snap(value: float, low: float, high: float, step: float | None) -> float:
    """``value`` clipped to ``[low, high]`` and rounded to the grid ``low + k * step``."""
    if step is None:
        return min(max(value, low), high)
    k = min(max(round((value - low) / step), 0), round((high - low) / step))
    return round(low + k * step, 10)


def _int_field(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} = {value!r}: must be an integer")
    return value


def _float_field(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} = {value!r}: must be a finite number")
    return float(value)


def _check_range(
    low_name: str, low: float, high_name: str, high: float, lowest: float, highest: float, what: str
) -> None:
    """Check ``lowest <= low <= high <= highest``, naming the field at fault."""
    if not lowest <= low <= highest:
        raise ValueError(f"{low_name} = {low!r}: must be in [{lowest}, {highest}] ({what})")
    if not lowest <= high <= highest:
        raise ValueError(f"{high_name} = {high!r}: must be in [{lowest}, {highest}] ({what})")
    if low > high:
        raise ValueError(f"{low_name} = {low!r} is above {high_name} = {high!r}: swap them")


def _check_step(step_name: str, step: Any, low: float, high: float) -> float | None:
    if step is None:
        return None
    value = _float_field(step_name, step)
    if value <= 0:
        raise ValueError(f"{step_name} = {step!r}: must be > 0, or null for a continuous range")
    k = (high - low) / value
    if abs(k - round(k)) > 1e-8:
        raise ValueError(
            f"{step_name} = {step!r}: the range [{low}, {high}] must be a whole number of steps; "
            "change the step or the range"
        )
    return value


# --------------------------------------------------------------------------------------------------
# the spaces
@dataclass(frozen=True, kw_only=True)
class SearchSpace(ABC):
    """A family of schedules that an Optuna trial picks from.

    Subclasses hold the ranges (validated in ``__post_init__``) and implement three methods:
    :meth:`suggest_params` (ask a trial), :meth:`to_schedule` (parameters -> schedule, pure) and
    :meth:`warm_start` (starting points). :meth:`suggest` joins the first two.

    Args:
        name: the space's name (the YAML file's stem).
        description: one line for people.
        scoring: the scoring rules to choose from (spellings of :class:`~lazyllm.scoring.Scoring`,
            stored canonically); one rule means no ``scoring`` parameter.
    """

    kind: ClassVar[str]

    name: str
    description: str = ""
    scoring: tuple[str, ...] = (str(Scoring()),)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"name = {self.name!r}: must be a non-empty string")
        if not isinstance(self.description, str):
            raise ValueError(f"description = {self.description!r}: must be a string")
        rules = self.scoring
        if isinstance(rules, str) or not isinstance(rules, (list, tuple)) or not rules:
            raise ValueError(
                f"scoring = {rules!r}: must be a non-empty list of scoring rules, e.g. [last, fastkv]"
            )
        canonical: list[str] = []
        for rule in rules:
            try:
                spelled = str(Scoring.parse(str(rule)))
            except ValueError as exc:
                raise ValueError(f"scoring = {list(rules)!r}: {exc}") from None
            if spelled in canonical:
                raise ValueError(f"scoring = {list(rules)!r}: {rule!r} repeats {spelled!r}; remove one")
            canonical.append(spelled)
        object.__setattr__(self, "scoring", tuple(canonical))

    @abstractmethod
    def suggest_params(self, trial: BaseTrial, num_layers: int) -> dict[str, Any]:
        """Ask ``trial`` for this space's parameters (define-by-run) and return them by name."""

    @abstractmethod
    def to_schedule(self, params: Mapping[str, Any], model: str, num_layers: int) -> Schedule:
        """The schedule that ``params`` stand for (pure).

        Keys this space does not use are ignored (a trial may hold other parameters); a missing or
        out-of-range parameter is a ``ValueError`` naming it.
        """

    @abstractmethod
    def warm_start(self, num_layers: int) -> list[dict[str, Any]]:
        """Parameter dicts for ``study.enqueue_trial``, inside this space: keep-all (where the space
        holds it) first, then a paper-style progressive schedule (today's rule), then the published
        peers with their own rules (:meth:`peer_starts`), then the one-stage hand-made family
        (:meth:`hand_made_starts`)."""

    def suggest(self, trial: BaseTrial, model: str, num_layers: int) -> Schedule:
        """Ask ``trial`` for a schedule of ``model`` (``num_layers`` decoder layers), its scoring rule
        included."""
        _check_num_layers(num_layers)
        params = self.suggest_params(trial, num_layers)
        if len(self.scoring) > 1:
            params["scoring"] = trial.suggest_categorical("scoring", list(self.scoring))
        return self.to_schedule(params, model, num_layers)

    def scoring_of(self, params: Mapping[str, Any]) -> Scoring:
        """The rule ``params`` choose: ``params["scoring"]`` (one of :attr:`scoring`), or today's rule
        where it is absent (parameters of older studies)."""
        if "scoring" not in params:
            return Scoring()
        value = params["scoring"]
        try:
            rule = Scoring.parse(str(value))
        except ValueError:
            rule = None
        if rule is None or str(rule) not in self.scoring:
            raise ValueError(
                f"params['scoring'] = {value!r}: must be one of {list(self.scoring)} (search space {self.name!r})"
            )
        return rule

    def _schedule(
        self, model: str, percentiles: tuple[float, ...], used: dict[str, Any], params: Mapping[str, Any]
    ) -> Schedule:
        """The schedule of ``percentiles`` with the rule ``params`` choose; ``used`` (plus the rule) as metadata."""
        rule = self.scoring_of(params)
        if "scoring" in params:
            used = {**used, "scoring": str(rule)}
        return Schedule(model=model, percentiles=percentiles, metadata=self._metadata(used), scoring=rule)

    def _with_rule(self, point: dict[str, Any], rule: Scoring) -> dict[str, Any]:
        """``point`` with its ``scoring`` parameter where the space has one: ``rule`` if the space
        offers it, else the space's first rule."""
        if len(self.scoring) > 1:
            point["scoring"] = str(rule) if str(rule) in self.scoring else self.scoring[0]
        return point

    @abstractmethod
    def _one_stage(self, layer: int, keep: float, num_layers: int) -> dict[str, Any]:
        """Parameters of this space nearest to one stage keeping ``keep`` after ``layer`` (clipped to
        the space's ranges)."""

    def family_starts(self, num_layers: int) -> list[dict[str, Any]]:
        """Starting points for the families of schedules beyond paper-style, with today's rule: one
        stage at mid depth pruning half the tokens (spaces with several stages add a gradual one)."""
        mid = min(num_layers // 2, num_layers - 2)  # the last layer cannot prune (nothing follows it)
        return [self._with_rule(self._one_stage(mid, 0.5, num_layers), Scoring())]

    def peer_starts(self, num_layers: int) -> list[dict[str, Any]]:
        """The published peers (:mod:`lazyllm.peers`) as points of this space, each as one stage at its
        own layer with its own rule (clipped to the space): first every peer keeping
        :data:`GENTLE_PEER_KEEP` of the tokens, then every peer at its published share (where the
        space's range does not make the two one point)."""
        gentle: list[dict[str, Any]] = []
        published: list[dict[str, Any]] = []
        for peer in PEERS.values():
            if peer.published:
                layer, keep = peer.as_stage(num_layers)
                softer = max(keep, GENTLE_PEER_KEEP)
                gentle.append(self._with_rule(self._one_stage(layer, softer, num_layers), peer.rule))
                published.append(self._with_rule(self._one_stage(layer, keep, num_layers), peer.rule))
        return [*gentle, *(p for p in published if p not in gentle)]

    def hand_made_starts(self, num_layers: int, queued: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The one-stage hand-made family (:func:`tuner.handmade.one_stage_points`) as points of this
        space with today's rule (clipped to the space), less the points already ``queued``. The
        held-out check holds every study to these schedules, so the study evaluates them itself: on
        gemma3-270m, keeping 30% after a quarter of the depth ran 2.09x on test with a task loss of
        1.21 points [-0.31, 2.95] (n=29) while the study, which had never tried it, recommended a
        1.28x schedule."""
        out: list[dict[str, Any]] = []
        for layer, keep in one_stage_points(num_layers):
            point = self._with_rule(self._one_stage(layer, keep / 100.0, num_layers), Scoring())
            if point not in queued and point not in out:
                out.append(point)
        return out

    def describe(self) -> dict[str, Any]:
        """The space's settings as a JSON-able dict (for logging)."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    # ---- parameter reading, shared by the subclasses
    def _param(self, params: Mapping[str, Any], key: str) -> Any:
        if key not in params:
            raise ValueError(
                f"params has no {key!r} (search space {self.name!r}, kind {self.kind}); got {sorted(params)}"
            )
        return params[key]

    def _int_param(self, params: Mapping[str, Any], key: str, low: int, high: int, num_layers: int) -> int:
        value = self._param(params, key)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(
                f"params[{key!r}] = {value!r}: must be an integer in [{low}, {high}] "
                f"(search space {self.name!r}, {num_layers} layers)"
            )
        return int(value)

    def _float_param(
        self, params: Mapping[str, Any], key: str, low: float, high: float, num_layers: int
    ) -> float:
        value = self._param(params, key)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not low - _TOL <= value <= high + _TOL
        ):
            raise ValueError(
                f"params[{key!r}] = {value!r}: must be a number in [{low}, {high}] "
                f"(search space {self.name!r}, {num_layers} layers)"
            )
        return min(max(float(value), low), high)

    def _metadata(self, used: Mapping[str, Any]) -> dict[str, Any]:
        return {"search_space": self.name, "params": dict(used)}


@dataclass(frozen=True, kw_only=True)
class StagesSpace(SearchSpace):
    """Up to ``max_stages`` pruning stages, each a layer and a percentile.

    Parameters: ``n_stages`` in ``0..max_stages``; for each stage ``i < n_stages``, ``stage{i}_layer``
    (an integer layer in :meth:`layer_range`) and ``stage{i}_pct`` (in ``[pct_low, pct_high]``, on the
    ``pct_step`` grid if set). ``n_stages = 0`` is keep-all. Stages on the same layer compose
    multiplicatively (:func:`compose_percentiles`, capped at :data:`MAX_COMPOSED_PCT`).

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
        if _int_field("max_stages", self.max_stages) < 1:
            raise ValueError(f"max_stages = {self.max_stages!r}: must be >= 1 (0 stages is always included)")
        min_depth = _float_field("min_depth", self.min_depth)
        if not 0.0 <= min_depth <= 1.0:
            raise ValueError(f"min_depth = {self.min_depth!r}: must be a fraction of depth in [0, 1]")
        low, high = _float_field("pct_low", self.pct_low), _float_field("pct_high", self.pct_high)
        _check_range("pct_low", low, "pct_high", high, 0.0, 99.0, "a prune percentile")
        if high <= 0:
            raise ValueError(f"pct_high = {self.pct_high!r}: must be > 0, or the space cannot prune")
        object.__setattr__(self, "min_depth", min_depth)
        object.__setattr__(self, "pct_low", low)
        object.__setattr__(self, "pct_high", high)
        object.__setattr__(self, "pct_step", _check_step("pct_step", self.pct_step, low, high))

    def layer_range(self, num_layers: int) -> tuple[int, int]:
        """The layers a stage may prune after: ``depth_to_layer(min_depth, L) .. L-2``."""
        return depth_to_layer(self.min_depth, num_layers), num_layers - 2

    def suggest_params(self, trial: BaseTrial, num_layers: int) -> dict[str, Any]:
        low, high = self.layer_range(num_layers)
        params: dict[str, Any] = {"n_stages": trial.suggest_int("n_stages", 0, self.max_stages)}
        for i in range(params["n_stages"]):
            params[f"stage{i}_layer"] = trial.suggest_int(f"stage{i}_layer", low, high)
            params[f"stage{i}_pct"] = trial.suggest_float(
                f"stage{i}_pct", self.pct_low, self.pct_high, step=self.pct_step
            )
        return params

    def to_schedule(self, params: Mapping[str, Any], model: str, num_layers: int) -> Schedule:
        _check_num_layers(num_layers)
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
        """Keep-all (``n_stages = 0``), then the paper-style stages with layers clipped to
        :meth:`layer_range` and percentiles clipped and rounded to the range and grid (today's rule),
        then the families (:meth:`family_starts`: one stage at mid depth, a gradual three-stage
        schedule), then the peers (:meth:`SearchSpace.peer_starts`: gentler shares, then published),
        then the one-stage hand-made family (:meth:`SearchSpace.hand_made_starts`)."""
        _check_num_layers(num_layers)
        low, high = self.layer_range(num_layers)
        paper = _paper_reference(num_layers, self.max_stages)
        stages = [(layer, p) for layer, p in enumerate(paper.percentiles) if p > 0]
        point: dict[str, Any] = {"n_stages": len(stages)}
        for i, (layer, p) in enumerate(stages):
            point[f"stage{i}_layer"] = min(max(layer, low), high)
            point[f"stage{i}_pct"] = _snap(p, self.pct_low, self.pct_high, self.pct_step)
        keep_all = self._with_rule({"n_stages": 0}, Scoring())
        points = [
            keep_all,
            self._with_rule(point, Scoring()),
            *self.family_starts(num_layers),
            *self.peer_starts(num_layers),
        ]
        return [*points, *self.hand_made_starts(num_layers, points)]

    def family_starts(self, num_layers: int) -> list[dict[str, Any]]:
        """One stage at mid depth pruning half, then (with room for three stages) a gradual schedule
        pruning 40% after each quarter of depth: on SmolLM2 the fastest hand-made schedule within a
        2-point budget on test (``benchmarks/objective_noise.py``: 1.72x FLOP, loss 1.18 points)."""
        points = super().family_starts(num_layers)
        if self.max_stages >= 3:
            low, high = self.layer_range(num_layers)
            gradual: dict[str, Any] = {"n_stages": 3}
            for i in range(3):
                gradual[f"stage{i}_layer"] = min(max(round((i + 1) * num_layers / 4), low), high)
                gradual[f"stage{i}_pct"] = _snap(40.0, self.pct_low, self.pct_high, self.pct_step)
            points.append(self._with_rule(gradual, Scoring()))
        return points

    def _one_stage(self, layer: int, keep: float, num_layers: int) -> dict[str, Any]:
        low, high = self.layer_range(num_layers)
        return {
            "n_stages": 1,
            "stage0_layer": min(max(layer, low), high),
            "stage0_pct": _snap(100.0 * (1.0 - keep), self.pct_low, self.pct_high, self.pct_step),
        }


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
            object.__setattr__(self, key, _float_field(key, getattr(self, key)))
        _check_range(
            "start_depth_low",
            self.start_depth_low,
            "start_depth_high",
            self.start_depth_high,
            0.0,
            1.0,
            "a fraction of depth",
        )
        _check_range(
            "final_keep_low",
            self.final_keep_low,
            "final_keep_high",
            self.final_keep_high,
            _MIN_FINAL_KEEP,
            1.0,
            "the share of the prompt reaching the last layer",
        )
        low, high = (
            _int_field("n_stages_low", self.n_stages_low),
            _int_field("n_stages_high", self.n_stages_high),
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
        _check_num_layers(num_layers)
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
        """Keep-all (``final_keep = 1``; only when ``final_keep_high == 1``), then the paper-style
        point: start at mid-depth, keep 0.3, 4 stages, ``even`` (each clipped to its range), then the
        families, the peers and the one-stage hand-made family, as in the other spaces."""
        _check_num_layers(num_layers)
        paper_start = min(num_layers // 2, num_layers - 2) / (num_layers - 1)
        points: list[dict[str, Any]] = []
        if self.final_keep_high == 1.0:
            points.append(
                {
                    "start_depth": self.start_depth_low,
                    "final_keep": 1.0,
                    "n_stages": self.n_stages_low,
                    "shape": self.shapes[0],
                }
            )
        points.append(
            {
                "start_depth": _snap(paper_start, self.start_depth_low, self.start_depth_high, None),
                "final_keep": _snap(_PAPER_FINAL_KEEP, self.final_keep_low, self.final_keep_high, None),
                "n_stages": min(max(_PAPER_STAGES, self.n_stages_low), self.n_stages_high),
                "shape": "even" if "even" in self.shapes else self.shapes[0],
            }
        )
        queued = [
            *(self._with_rule(p, Scoring()) for p in points),
            *self.family_starts(num_layers),
            *self.peer_starts(num_layers),
        ]
        return [*queued, *self.hand_made_starts(num_layers, queued)]

    def _one_stage(self, layer: int, keep: float, num_layers: int) -> dict[str, Any]:
        return {
            "start_depth": _snap(layer / (num_layers - 1), self.start_depth_low, self.start_depth_high, None),
            "final_keep": _snap(keep, self.final_keep_low, self.final_keep_high, None),
            "n_stages": self.n_stages_low,
            "shape": "even" if "even" in self.shapes else self.shapes[0],
        }


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
        high = _float_field("pct_high", self.pct_high)
        if not 0.0 < high <= 99.0:
            raise ValueError(f"pct_high = {self.pct_high!r}: must be in (0, 99] (a prune percentile)")
        object.__setattr__(self, "pct_high", high)
        object.__setattr__(self, "pct_step", _check_step("pct_step", self.pct_step, 0.0, high))

    def suggest_params(self, trial: BaseTrial, num_layers: int) -> dict[str, Any]:
        return {
            f"layer{layer}_pct": trial.suggest_float(
                f"layer{layer}_pct", 0.0, self.pct_high, step=self.pct_step
            )
            for layer in range(num_layers - 1)
        }

    def to_schedule(self, params: Mapping[str, Any], model: str, num_layers: int) -> Schedule:
        _check_num_layers(num_layers)
        used = {
            f"layer{layer}_pct": self._float_param(
                params, f"layer{layer}_pct", 0.0, self.pct_high, num_layers
            )
            for layer in range(num_layers - 1)
        }
        values = (*used.values(), 0.0)
        return self._schedule(model, values, used, params)

    def warm_start(self, num_layers: int) -> list[dict[str, Any]]:
        """Keep-all (all zero), then the paper-style percentiles clipped and rounded to the grid, then
        the families, the peers and the one-stage hand-made family, as in the other spaces."""
        _check_num_layers(num_layers)
        paper = _paper_reference(num_layers)
        keep_all = {f"layer{layer}_pct": 0.0 for layer in range(num_layers - 1)}
        point = {
            f"layer{layer}_pct": _snap(paper.percentiles[layer], 0.0, self.pct_high, self.pct_step)
            for layer in range(num_layers - 1)
        }
        rule = Scoring()
        points = [
            self._with_rule(keep_all, rule),
            self._with_rule(point, rule),
            *self.family_starts(num_layers),
            *self.peer_starts(num_layers),
        ]
        return [*points, *self.hand_made_starts(num_layers, points)]

    def _one_stage(self, layer: int, keep: float, num_layers: int) -> dict[str, Any]:
        pct = _snap(100.0 * (1.0 - keep), 0.0, self.pct_high, self.pct_step)
        return {f"layer{i}_pct": pct if i == layer else 0.0 for i in range(num_layers - 1)}


# --------------------------------------------------------------------------------------------------
# registry and loading
KINDS: dict[str, type[SearchSpace]] = {
    ParametricSpace.kind: ParametricSpace,
    PerLayerSpace.kind: PerLayerSpace,
    StagesSpace.kind: StagesSpace,
}
"""Space classes by their YAML ``kind``."""


def space_from_dict(data: Any, *, name: str) -> SearchSpace:
    """Build a space from a parsed YAML mapping (``kind`` plus the fields of its class)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"must be a mapping of field: value, got {type(data).__name__}")
    if "kind" not in data:
        raise ValueError(f"missing field 'kind': set it to one of {', '.join(KINDS)}")
    kind = data["kind"]
    if kind not in KINDS:
        raise ValueError(f"kind = {kind!r}: unknown kind of search space; use one of {', '.join(KINDS)}")
    cls = KINDS[kind]
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "name"}
    unknown = sorted(str(key) for key in data if key != "kind" and key not in fields)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for kind {kind}; allowed: {sorted(fields)}")
    for key, f in fields.items():
        if key not in data and f.default is dataclasses.MISSING:
            raise ValueError(f"missing field {key!r}: kind {kind} needs it (see {cls.__name__})")
    return cls(name=name, **{key: value for key, value in data.items() if key != "kind"})


def list_spaces() -> list[str]:
    """The names of the spaces in :data:`SEARCH_SPACE_DIR`, sorted."""
    return sorted(path.stem for path in SEARCH_SPACE_DIR.glob("*.yaml"))


MAX_SPACE_BYTES = 100_000
"""A search space file is a dozen lines; anything larger is refused before it is parsed."""


def load_space(name_or_path: str | Path) -> SearchSpace:
    """The space named ``name_or_path`` (a file ``search_spaces/<name>.yaml``), or the YAML file at
    that path (anything ending in ``.yaml``/``.yml`` or holding a path separator).

    Every problem is a one-line ``ValueError``; problems with a file's content name the file.
    """
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text:
        path = Path(name_or_path)
    else:
        path = SEARCH_SPACE_DIR / f"{text}.yaml"
        if not path.is_file():
            raise ValueError(f"Unknown search space {text!r}. Available: {', '.join(list_spaces())}")
    try:
        size = path.stat().st_size
        if size > MAX_SPACE_BYTES:
            raise ValueError(
                f"search space file {path} is {size} bytes; a search space is at most {MAX_SPACE_BYTES}"
            )
        data = load_strict(path.read_bytes().decode("utf-8-sig"))
    except OSError as exc:
        raise ValueError(f"cannot read search space file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"search space file {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).split())
        raise ValueError(f"search space file {path} is not valid YAML: {first}") from None
    except (RecursionError, TypeError):  # nesting thousands deep; an unhashable (list) key
        raise ValueError(f"search space file {path}: not a flat mapping of field: value") from None
    try:
        return space_from_dict(data, name=path.stem)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"search space file {path}: {exc}") from None
