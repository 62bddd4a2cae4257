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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tuner.study.spaces.base import (
    SEARCH_SPACE_DIR,
    SHAPES,
    SearchSpace,
    compose_percentiles,
    depth_to_layer,
    shape_shares,
)
from tuner.study.spaces.parametric import ParametricSpace
from tuner.study.spaces.per_layer import PerLayerSpace
from tuner.study.spaces.stages import StagesSpace
from tuner.study.strict_yaml import load_strict

__all__ = [
    "KINDS",
    "SEARCH_SPACE_DIR",
    "SHAPES",
    "ParametricSpace",
    "PerLayerSpace",
    "SearchSpace",
    "StagesSpace",
    "compose_percentiles",
    "depth_to_layer",
    "list_spaces",
    "load_space",
    "shape_shares",
    "space_from_dict",
]

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
