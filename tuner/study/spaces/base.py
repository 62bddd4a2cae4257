"""What every search space shares: the :class:`SearchSpace` base class, depth fractions and the
field checks of the YAML files (see :mod:`tuner.study.spaces`)."""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from optuna.trial import BaseTrial

from lazyllm.peers import PEERS
from lazyllm.schedule import Schedule
from lazyllm.scoring import Scoring
from tuner.study.handmade import one_stage_points

SEARCH_SPACE_DIR = Path(__file__).resolve().parents[3] / "search_spaces"
"""The folder of named search spaces: ``<name>.yaml``."""

SHAPES: tuple[str, ...] = ("even", "front", "back")
"""Curve shapes of :class:`ParametricSpace`."""

MAX_COMPOSED_PCT = 99.0
"""Cap on the percentile of a layer where several stages of :class:`StagesSpace` fall together."""

KEEP_ALL_ATTR = "keep_all"
"""User attr of the study's reference trial: keep-all, queued once before the warm starts
(:func:`tuner.study.storage.warm_start`) with no parameters, so it is no point of the sampler's space
(:meth:`SearchSpace.trial_schedule`)."""

PAPER_FINAL_KEEP = 0.3  # as Schedule.paper_style
PAPER_STAGES = 4  # as Schedule.paper_style
MIN_FINAL_KEEP = 0.001
TOL = 1e-9


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


def check_num_layers(num_layers: int) -> None:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 2:
        raise ValueError(
            f"num_layers = {num_layers!r}: must be an integer >= 2 (the last layer cannot prune, so a "
            "1-layer model has nothing to tune)"
        )


def paper_reference(num_layers: int, max_stages: int = PAPER_STAGES) -> Schedule:
    """``Schedule.paper_style`` where the model is deep enough, else the nearest progressive schedule
    (start at mid-depth, at most one stage per remaining prunable layer, at most ``max_stages``)."""
    start = min(num_layers // 2, num_layers - 2)
    stages = min(PAPER_STAGES, max_stages, num_layers - 1 - start)
    return Schedule.progressive(
        "paper-style", num_layers, start_layer=start, final_keep=PAPER_FINAL_KEEP, stages=stages
    )


def snap(value: float, low: float, high: float, step: float | None) -> float:
    """``value`` clipped to ``[low, high]`` and rounded to the grid ``low + k * step``."""
    if step is None:
        return min(max(value, low), high)
    k = min(max(round((value - low) / step), 0), round((high - low) / step))
    return round(low + k * step, 10)


def int_field(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} = {value!r}: must be an integer")
    return value


def float_field(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} = {value!r}: must be a finite number")
    return float(value)


def check_range(
    low_name: str, low: float, high_name: str, high: float, lowest: float, highest: float, what: str
) -> None:
    """Check ``lowest <= low <= high <= highest``, naming the field at fault."""
    if not lowest <= low <= highest:
        raise ValueError(f"{low_name} = {low!r}: must be in [{lowest}, {highest}] ({what})")
    if not lowest <= high <= highest:
        raise ValueError(f"{high_name} = {high!r}: must be in [{lowest}, {highest}] ({what})")
    if low > high:
        raise ValueError(f"{low_name} = {low!r} is above {high_name} = {high!r}: swap them")


def check_step(step_name: str, step: Any, low: float, high: float) -> float | None:
    if step is None:
        return None
    value = float_field(step_name, step)
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
        """Parameter dicts for ``study.enqueue_trial``, inside this space: a paper-style progressive
        schedule (today's rule), then the published peers with their own rules (:meth:`peer_starts`),
        then the one-stage hand-made family (:meth:`hand_made_starts`). Keep-all is not among them:
        the study queues it once as its reference trial (:data:`KEEP_ALL_ATTR`)."""

    def trial_schedule(self, trial: BaseTrial, model: str, num_layers: int) -> Schedule:
        """The schedule ``trial`` evaluates: keep-all for the study's reference trial (user attr
        :data:`KEEP_ALL_ATTR`, no parameters asked, so the sampler never models it), else
        :meth:`suggest`."""
        if trial.user_attrs.get(KEEP_ALL_ATTR):
            check_num_layers(num_layers)
            return Schedule.keep_all(model, num_layers)
        return self.suggest(trial, model, num_layers)

    def suggest(self, trial: BaseTrial, model: str, num_layers: int) -> Schedule:
        """Ask ``trial`` for a schedule of ``model`` (``num_layers`` decoder layers), its scoring rule
        included."""
        check_num_layers(num_layers)
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
        stage at mid depth pruning half the tokens (a hand-made point, chosen on no data; the stages
        space adds a validation-chosen one)."""
        mid = min(num_layers // 2, num_layers - 2)  # the last layer cannot prune (nothing follows it)
        return [self._with_rule(self._one_stage(mid, 0.5, num_layers), Scoring())]

    def peer_starts(self, num_layers: int) -> list[dict[str, Any]]:
        """The published peers (:mod:`lazyllm.peers`) as points of this space, each as one stage at its
        published layer and share with its own rule (clipped to the space): GemFilter filtering at
        layer 13 of 32 and keeping 20% (the share FastKV's authors run it with on LongBench), FastKV's
        TSP after layer 15 of 32 keeping 20%, each layer scaled to the model's depth (the sources are
        in each peer module's docstring). No share was chosen on data of ours."""
        points: list[dict[str, Any]] = []
        for peer in PEERS.values():
            if peer.published:
                layer, keep = peer.as_stage(num_layers)
                point = self._with_rule(self._one_stage(layer, keep, num_layers), peer.rule)
                if point not in points:
                    points.append(point)
        return points

    def hand_made_starts(self, num_layers: int, queued: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The one-stage hand-made family (:func:`tuner.study.handmade.one_stage_points`) as points of this
        space with today's rule (clipped to the space), less the points already ``queued``. The
        held-out check holds every study to these schedules, so the study evaluates them itself: a
        study that never tried one can recommend a schedule slower than a hand-made one within the
        same budget (a measured case is in docs/)."""
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
            or not low - TOL <= value <= high + TOL
        ):
            raise ValueError(
                f"params[{key!r}] = {value!r}: must be a number in [{low}, {high}] "
                f"(search space {self.name!r}, {num_layers} layers)"
            )
        return min(max(float(value), low), high)

    def _metadata(self, used: Mapping[str, Any]) -> dict[str, Any]:
        return {"search_space": self.name, "params": dict(used)}
