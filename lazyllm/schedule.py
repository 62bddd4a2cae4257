"""Per-layer pruning schedules: what LazyLLM prunes, after which layer.

A :class:`Schedule` holds one prune percentile ``p[l]`` in ``[0, 100)`` per decoder layer of a named
model. Semantics (LazyLLM, Fu et al. 2024):

* After layer ``l`` has run, every token still active is scored by the schedule's
  :class:`~lazyllm.scoring.Scoring` rule; the default (LazyLLM's, and every version-1 and version-2
  file's) is the attention probability that the last position pays to it at layer ``l`` (softmax
  over the active keys, mean over all query heads).
* The lowest-scoring tokens leave the computation for every later layer, so layer ``l + 1`` sees a
  subset of the tokens of layer ``l``. The last position always survives.
* ``p[l] == 0`` means layer ``l`` prunes nothing. The last layer has no later layer to prune for, so
  its percentile must be 0.

**Rounding rule.** With ``n`` tokens active at layer ``l`` (the last position included), exactly
``min(floor(p[l] * n / 100), n - 1)`` tokens are pruned after layer ``l``: the lowest scorers among the
``n - 1`` tokens other than the last position. Ties in score prune the earlier position first.
``floor`` is taken with a tolerance of 1e-9 so that e.g. ``p = 30, n = 10`` prunes 3, not 2.

**Revival policy** (:class:`Revival`): what decoding steps do with tokens the prefill pruned.

* ``frozen`` (the default, the tuner's, and what every study measured): each decoding step sees, at
  every layer, exactly the tokens that layer has computed (the prefill's survivors plus the generated
  tokens); no re-selection, no revival, no Aux Cache.
* ``dynamic`` (the paper's, and every version-1 file's): each step re-selects the active set at every
  pruning layer; a token chosen again at a layer it never computed is *revived* from the Aux Cache.
* ``budget:B``: like ``dynamic``, but a step computes at most ``B`` (token, layer) pairs besides its
  new token; the best-ranked revival candidates get the budget, the others are pruned.

JSON format (version 3; version 1 has no ``revival`` field and means ``dynamic``, the paper's policy,
whatever the default; versions 2 and 3 always carry the field, so a file keeps its meaning when the
default changes; versions 1 and 2 have no ``scoring`` field and mean the default rule
``w1-softmax-none-mean``)::

    {"format": "lazyllm-schedule", "version": 3, "model": "smollm2-135m", "num_layers": 30,
     "percentiles": [0, 0, ..., 50, ..., 0], "revival": {"policy": "frozen"},
     "scoring": {"window": 1, "values": "softmax", "pool": "none", "kernel": 1, "heads": "mean",
                 "layers": "layer"}, "metadata": {...}}
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lazyllm.atomic import write_atomic
from lazyllm.scoring import Scoring

FORMAT_NAME = "lazyllm-schedule"
FORMAT_VERSION = 3
_READS_VERSIONS = (1, 2, 3)
_FLOOR_TOLERANCE = 1e-9
REVIVAL_POLICIES = ("dynamic", "frozen", "budget")


@dataclass(frozen=True)
class Revival:
    """How decoding steps treat prompt tokens pruned earlier (see the module docstring).

    Args:
        policy: ``"frozen"`` (the default), ``"dynamic"`` or ``"budget"``.
        budget: only for ``"budget"``: at most this many (token, layer) computations per decoding
            step besides the new token's own.

    >>> Revival.parse("budget:32")
    Revival(policy='budget', budget=32)
    >>> str(Revival())
    'frozen'
    """

    policy: str = "frozen"
    budget: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in REVIVAL_POLICIES:
            raise ValueError(
                f"revival policy = {self.policy!r}: unknown. Available: {', '.join(REVIVAL_POLICIES)} "
                "(budget as 'budget:N')"
            )
        if self.policy == "budget":
            if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 0:
                raise ValueError(
                    f"revival budget = {self.budget!r}: must be an integer >= 0 for policy 'budget'"
                )
        elif self.budget is not None:
            raise ValueError(f"revival budget = {self.budget!r}: only policy 'budget' takes a budget")

    @classmethod
    def parse(cls, text: str) -> Revival:
        """``"dynamic"``, ``"frozen"`` or ``"budget:N"`` (the spelling :meth:`__str__` writes)."""
        name, _, budget = str(text).partition(":")
        if name != "budget":
            if budget:
                raise ValueError(f"revival policy = {text!r}: only 'budget:N' takes a number")
            return cls(name)
        if not budget.strip().isdigit():
            raise ValueError(
                f"revival policy = {text!r}: write the budget as 'budget:N' with an integer N >= 0"
            )
        return cls("budget", int(budget))

    def __str__(self) -> str:
        return self.policy if self.budget is None else f"{self.policy}:{self.budget}"

    @property
    def revives(self) -> bool:
        """Whether decoding steps may compute a pruned token again (everything but ``frozen``)."""
        return self.policy != "frozen"

    def to_dict(self) -> dict[str, Any]:
        return {"policy": self.policy} | ({} if self.budget is None else {"budget": self.budget})

    @classmethod
    def from_dict(cls, data: Any) -> Revival:
        if not isinstance(data, Mapping) or set(data) - {"policy", "budget"} or "policy" not in data:
            raise ValueError(
                f'revival = {data!r}: must be an object {{"policy": ..., "budget": N (budget only)}}'
            )
        return cls(data["policy"], data.get("budget"))


MAX_JSON_BYTES = 1_000_000
"""A schedule file is a few KB (one number per layer plus provenance); anything larger is refused."""
MAX_DEPTH = 32
"""Deepest nesting of lists and objects a schedule's JSON (its metadata) may have."""


def num_pruned(percentile: float, n_active: int) -> int:
    """Number of tokens pruned after a layer with ``n_active`` active tokens (the rounding rule).

    >>> num_pruned(50.0, 7)
    3
    >>> num_pruned(99.0, 2)  # the last position always survives
    1
    """
    if n_active <= 1 or percentile <= 0:
        return 0
    return min(math.floor(percentile * n_active / 100.0 + _FLOOR_TOLERANCE), n_active - 1)


def _jsonable(value: Any, where: str, depth: int = 0) -> Any:
    """Check that ``value`` is made of JSON types only (metadata must round-trip exactly)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"metadata{where[:60]}...: nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"metadata{where} = {value!r}: must be a finite number (JSON has no NaN/inf)")
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"metadata{where} has key {k!r}: keys must be strings")
            out[k] = _jsonable(v, f"{where}[{k!r}]", depth + 1)
        return out
    raise ValueError(f"metadata{where} = {value!r}: only JSON types (dict, list, str, number, bool, null)")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}; each field may appear once")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; use a finite number")


def _check_depth(data: Any) -> None:
    """Iteratively (no recursion) refuse nesting deeper than :data:`MAX_DEPTH`."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (list, dict)):
            if depth >= MAX_DEPTH:
                raise ValueError(
                    f"nested more than {MAX_DEPTH} levels deep; a schedule's metadata is shallow"
                )
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def parse_json(text: str) -> Any:
    """Strict JSON: at most :data:`MAX_JSON_BYTES`, a leading UTF-8 BOM allowed, no duplicate keys,
    no NaN/Infinity, at most :data:`MAX_DEPTH` levels of nesting. Errors are one-line ``ValueError``s.

    >>> parse_json('\\ufeff{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> parse_json('{"a": 1, "a": 2}')
    Traceback (most recent call last):
    ValueError: duplicate key 'a'; each field may appear once
    """
    if len(text) > MAX_JSON_BYTES:
        raise ValueError(f"schedule JSON is {len(text)} characters; a schedule is at most {MAX_JSON_BYTES}")
    try:
        data = json.loads(
            text.removeprefix("\ufeff"), object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant
        )
    except json.JSONDecodeError as exc:
        raise ValueError(f"schedule is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(
            f"nested more than {MAX_DEPTH} levels deep; a schedule's metadata is shallow"
        ) from None
    _check_depth(data)
    return data


def _check_strict_types(data: Mapping[str, Any]) -> None:
    """JSON's loose spots Python would let through: ``true`` as a version, ``-0.0`` as a percentile."""
    version = data.get("version")
    if isinstance(version, bool) or (version is not None and not isinstance(version, int)):
        raise ValueError(f"version = {version!r}: must be an integer")
    percentiles = data.get("percentiles")
    if isinstance(percentiles, list):
        for layer, p in enumerate(percentiles):
            if isinstance(p, float) and p == 0 and math.copysign(1.0, p) < 0:
                raise ValueError(f"percentiles[{layer}] = -0.0: must be in [0, 100); write 0")


@dataclass(frozen=True)
class Schedule:
    """A LazyLLM pruning schedule for one model.

    Args:
        model: the model the schedule was made for (an alias such as ``"smollm2-135m"``, a hub id
            or a folder name); checked by :meth:`check_model`.
        percentiles: one prune percentile per decoder layer, each in ``[0, 100)``; the last is 0.
        metadata: optional provenance (study, trial, metrics, ...); JSON types only.
        revival: the decoding-time :class:`Revival` policy (or its spelling, e.g. ``"budget:32"``);
            ``frozen`` unless given, as the tuner measures schedules.
        scoring: the token-scoring :class:`~lazyllm.scoring.Scoring` rule of every selection, in the
            prefill and in decoding-time re-selection (or its spelling, e.g. ``"fastkv"``).
    """

    model: str
    percentiles: tuple[float, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False)
    revival: Revival = field(default_factory=Revival)
    scoring: Scoring = field(default_factory=Scoring)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model = {self.model!r}: must be a non-empty string naming the model")
        if isinstance(self.percentiles, (str, bytes)) or not isinstance(self.percentiles, Sequence):
            raise ValueError(f"percentiles = {self.percentiles!r}: must be a list of numbers, one per layer")
        values: list[float] = []
        for layer, p in enumerate(self.percentiles):
            if isinstance(p, bool) or not isinstance(p, (int, float)):
                raise ValueError(f"percentiles[{layer}] = {p!r}: must be a number in [0, 100)")
            if not math.isfinite(p) or not 0.0 <= p < 100.0:
                raise ValueError(
                    f"percentiles[{layer}] = {p!r}: must be in [0, 100) (0 prunes nothing; 100 would prune all)"
                )
            values.append(float(p))
        if not values:
            raise ValueError("percentiles = []: need one value per decoder layer")
        if values[-1] != 0.0:
            raise ValueError(
                f"percentiles[{len(values) - 1}] = {values[-1]!r}: the last layer has no later layer "
                "to prune for; set it to 0"
            )
        if not isinstance(self.metadata, Mapping):
            raise ValueError(f"metadata = {self.metadata!r}: must be a JSON object (dict)")
        object.__setattr__(self, "percentiles", tuple(values))
        object.__setattr__(self, "metadata", _jsonable(dict(self.metadata), ""))
        if isinstance(self.revival, str):
            object.__setattr__(self, "revival", Revival.parse(self.revival))
        elif not isinstance(self.revival, Revival):
            raise ValueError(f"revival = {self.revival!r}: must be a Revival or its spelling, e.g. 'frozen'")
        if isinstance(self.scoring, str):
            object.__setattr__(self, "scoring", Scoring.parse(self.scoring))
        elif not isinstance(self.scoring, Scoring):
            raise ValueError(f"scoring = {self.scoring!r}: must be a Scoring or its spelling, e.g. 'fastkv'")

    def with_revival(self, revival: Revival | str) -> Schedule:
        """The same schedule with another revival policy (metadata kept)."""
        policy = revival if isinstance(revival, Revival) else Revival.parse(revival)
        return dataclasses.replace(self, revival=policy)

    def with_scoring(self, scoring: Scoring | str) -> Schedule:
        """The same schedule with another scoring rule (metadata kept)."""
        rule = scoring if isinstance(scoring, Scoring) else Scoring.parse(scoring)
        return dataclasses.replace(self, scoring=rule)

    # ----------------------------------------------------------------------------------------------
    # constructors
    @classmethod
    def keep_all(cls, model: str, num_layers: int) -> Schedule:
        """The schedule that prunes nothing (LazyLLM off)."""
        if num_layers < 1:
            raise ValueError(f"num_layers = {num_layers}: must be >= 1")
        return cls(model=model, percentiles=(0.0,) * num_layers)

    @classmethod
    def from_layers(cls, model: str, num_layers: int, prune_at: Mapping[int, float]) -> Schedule:
        """A schedule that prunes ``prune_at[l]`` percent after each listed layer ``l`` and nothing else.

        >>> Schedule.from_layers("m", 4, {1: 50}).percentiles
        (0.0, 50.0, 0.0, 0.0)
        """
        values = [0.0] * num_layers
        for layer, p in prune_at.items():
            if not 0 <= layer < num_layers:
                raise ValueError(f"prune_at has layer {layer}: the model has layers 0..{num_layers - 1}")
            values[layer] = float(p)
        return cls(model=model, percentiles=tuple(values))

    @classmethod
    def progressive(
        cls, model: str, num_layers: int, *, start_layer: int, final_keep: float, stages: int
    ) -> Schedule:
        """Paper-style progressive pruning: ``stages`` equal prunes spread from ``start_layer`` to the
        second-to-last layer, so that a fraction ``final_keep`` of the prompt reaches the last layer.

        >>> Schedule.progressive("m", 8, start_layer=2, final_keep=0.25, stages=2).percentiles
        (0.0, 0.0, 50.0, 0.0, 0.0, 0.0, 50.0, 0.0)
        """
        if not 0 <= start_layer <= num_layers - 2:
            raise ValueError(
                f"start_layer = {start_layer}: must be in 0..{num_layers - 2} (the last layer cannot prune)"
            )
        if not 0.0 < final_keep <= 1.0:
            raise ValueError(f"final_keep = {final_keep}: must be in (0, 1]")
        span = num_layers - 1 - start_layer
        if not 1 <= stages <= span:
            raise ValueError(f"stages = {stages}: must be in 1..{span} for start_layer {start_layer}")
        per_stage = round(100.0 * (1.0 - final_keep ** (1.0 / stages)), 6)
        layers = [start_layer + round(i * (span - 1) / max(stages - 1, 1)) for i in range(stages)]
        return cls.from_layers(model, num_layers, {layer: per_stage for layer in layers})

    @classmethod
    def paper_style(cls, model: str, num_layers: int) -> Schedule:
        """A hand-made default: 4 equal prunes from mid-depth on, 30% of the prompt reaching the last layer.

        Not tuned for any model; ``tuner.search`` finds better ones per model and task.
        """
        start = num_layers // 2
        stages = max(1, min(4, num_layers - 1 - start))  # shallow models have room for fewer stages
        return cls.progressive(model, num_layers, start_layer=start, final_keep=0.3, stages=stages)

    # ----------------------------------------------------------------------------------------------
    # views
    @property
    def num_layers(self) -> int:
        return len(self.percentiles)

    @property
    def prunes(self) -> bool:
        """Whether any layer prunes at all."""
        return any(p > 0 for p in self.percentiles)

    def keep_counts(self, n_tokens: int) -> list[int]:
        """Exact number of tokens each layer computes for an ``n_tokens`` prompt (the rounding rule).

        Returns a list of length ``num_layers``; entry ``l`` is the number of tokens active at layer ``l``.
        """
        if n_tokens < 1:
            raise ValueError(f"n_tokens = {n_tokens}: must be >= 1")
        counts = []
        n = n_tokens
        for p in self.percentiles:
            counts.append(n)
            n -= num_pruned(p, n)
        return counts

    def keep_fractions(self) -> list[float]:
        """Cumulative keep fraction per layer in the limit of a long prompt: ``prod_{j<l} (1 - p[j]/100)``."""
        fractions = []
        f = 1.0
        for p in self.percentiles:
            fractions.append(f)
            f *= 1.0 - p / 100.0
        return fractions

    # ----------------------------------------------------------------------------------------------
    # compatibility
    def check_model(self, model_name: str, num_layers: int, *, strict_name: bool = True) -> None:
        """Raise ``ValueError`` if this schedule does not fit a model with ``num_layers`` layers.

        A different model name is an error too unless ``strict_name=False`` (the layer count must
        always match).
        """
        if num_layers != self.num_layers:
            raise ValueError(
                f"schedule is for {self.model!r} with {self.num_layers} layers, but model {model_name!r} has "
                f"{num_layers} layers; tune or export a schedule for this model"
            )
        if strict_name and model_name != self.model:
            raise ValueError(
                f"schedule is for model {self.model!r}, not {model_name!r}; use a schedule made for this "
                "model (or pass strict_name=False / --allow-other-model to use it anyway)"
            )

    # ----------------------------------------------------------------------------------------------
    # JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "model": self.model,
            "num_layers": self.num_layers,
            "percentiles": list(self.percentiles),
            "revival": self.revival.to_dict(),
            "scoring": self.scoring.to_dict(),
            "metadata": dict(self.metadata),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> Path:
        """Write the schedule as JSON (atomically: a crash never leaves a half-written file)."""
        return write_atomic(path, self.to_json() + "\n")

    @classmethod
    def from_dict(cls, data: Any) -> Schedule:
        if not isinstance(data, Mapping):
            raise ValueError(f"schedule JSON must be an object, got {type(data).__name__}")
        _check_strict_types(data)
        if data.get("format") != FORMAT_NAME:
            raise ValueError(
                f"format = {data.get('format')!r}: expected {FORMAT_NAME!r}; is this a schedule file?"
            )
        version = data.get("version")
        if isinstance(version, bool) or version not in _READS_VERSIONS:
            raise ValueError(
                f"version = {version!r}: this lazyllm reads schedule versions "
                f"{', '.join(map(str, _READS_VERSIONS))}; upgrade lazyllm-tuner"
            )
        fields = {"format", "version", "model", "num_layers", "percentiles", "metadata"}
        if version >= 2:  # version 1 has no revival field: it meant the paper's dynamic re-selection
            fields.add("revival")
        if version >= 3:  # versions 1 and 2 have no scoring field: the last position's attention
            fields.add("scoring")
        unknown = set(data) - fields
        if unknown:
            raise ValueError(
                f"unknown field(s) {sorted(unknown)} in schedule JSON (version {version}); remove them"
            )
        for key in sorted(fields - {"format", "version", "metadata"}):  # model, num_layers, ...
            if key not in data:
                raise ValueError(f"missing field {key!r} in schedule JSON")
        percentiles = data["percentiles"]
        if not isinstance(percentiles, list):
            raise ValueError(f"percentiles = {percentiles!r}: must be a list of numbers, one per layer")
        num_layers = data["num_layers"]
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers != len(percentiles):
            raise ValueError(
                f"num_layers = {num_layers!r} but percentiles has {len(percentiles)} entries; they must agree"
            )
        metadata = data.get("metadata", {})
        if metadata is None:
            metadata = {}
        revival = Revival.from_dict(data["revival"]) if version >= 2 else Revival("dynamic")
        scoring = Scoring.from_dict(data["scoring"]) if version >= 3 else Scoring()
        return cls(
            model=data["model"],
            percentiles=tuple(percentiles),
            metadata=metadata,
            revival=revival,
            scoring=scoring,
        )

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        return cls.from_dict(parse_json(text))

    @classmethod
    def from_mlflow(cls, run: str, tracking_uri: str | None = None) -> Schedule:
        """Load a schedule from MLflow: a run id, ``runs:/<id>/schedule.json``, or a registered model
        version, ``models:/NAME@alias`` or ``models:/NAME/<version>`` (the ``schedule.json`` bundled in
        the model that ``python -m tuner.export --register NAME`` made).

        Needs the ``mlflow`` package, imported here only (the engine itself never imports it).
        ``tracking_uri`` defaults to MLflow's own (``$MLFLOW_TRACKING_URI``); the registry is the same store.
        """
        try:
            import mlflow
        except ImportError:
            raise ValueError("Schedule.from_mlflow needs the mlflow package: pip install mlflow") from None
        import tempfile

        uri = run if run.startswith(("runs:/", "models:/")) else f"runs:/{run}/schedule.json"
        with tempfile.TemporaryDirectory(prefix="lazyllm-schedule-") as tmp:
            try:
                if uri.startswith("models:/"):  # resolved here: MLflow would use its global registry URI
                    client = mlflow.MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
                    name, at, alias = uri[len("models:/") :].partition("@")
                    if at:
                        found = client.get_model_version_by_alias(name, alias)
                    else:
                        name, _, number = name.partition("/")
                        if not number.isdigit():
                            raise ValueError("give models:/NAME@alias or models:/NAME/<version number>")
                        found = client.get_model_version(name, number)
                    source = client.get_model_version_download_uri(found.name, found.version)
                else:
                    source = uri
                path = Path(
                    mlflow.artifacts.download_artifacts(
                        artifact_uri=source, dst_path=tmp, tracking_uri=tracking_uri
                    )
                )
            except Exception as exc:  # MLflow raises several types for a missing run, model or artifact
                first = (str(exc).splitlines() or [type(exc).__name__])[0]
                raise ValueError(f"cannot download {uri} from MLflow: {first}") from None
            if path.is_dir():  # a model folder: the schedule is one of its artifacts
                files = sorted(path.rglob("schedule.json"))
                if not files:
                    raise ValueError(f"{uri} holds no schedule.json (not a lazyllm schedule model?)")
                path = files[0]
            return cls.load(path)

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        """Read a schedule JSON file; every problem is a one-line ``ValueError`` naming the file."""
        path = Path(path)
        try:
            size = path.stat().st_size
            if size > MAX_JSON_BYTES:
                raise ValueError(
                    f"schedule file {path} is {size / 1e6:.1f} MB; a schedule is at most "
                    f"{MAX_JSON_BYTES / 1e6:.0f} MB (is this the right file?)"
                )
            text = path.read_bytes().decode("utf-8-sig")  # a leading BOM (some editors add one) is fine
        except OSError as exc:
            raise ValueError(f"cannot read schedule file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ValueError(f"schedule file {path} is not UTF-8 text") from None
        try:
            return cls.from_json(text)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
