"""A slope learned once per model on the open-QA grid: the floor of an underpowered calibration.

A study's own calibration (:mod:`tuner.statistics.calibration`) fits task-score points per nat of KL
on the few schedules it task-scores, on its validation examples. With a dozen examples it can see no
cost at all (a slope at or below 0) and then certifies every schedule up to its largest scored KL,
which on test may lose twice the budget. A :class:`SlopePrior` is the same pooled slope fitted on a
large recorded grid: every LazyLLM schedule of ``benchmarks/record_grid.py`` on hundreds of
long-context QA examples built from HotpotQA and SQuAD (:mod:`tuner.data.openqa`), for the same
model. It is computed once (``benchmarks/slope_prior.py``), stored beside this module as
``priors/<model>-<tokens>.json`` with the sha256 of the rows it came from, one per recorded prompt
length, and read by every study on that model (``--slope-prior``; ``auto`` reads the one recorded at
the prompt length nearest the study's).

**Shape.** A prior is fitted at one exponent (``loss = slope * KL^p``,
:mod:`tuner.statistics.calibration`); a study reads only a prior fitted at its own
``calibration_exponent`` (``p = 1`` files are ``<model>-<tokens>.json``, others
``<model>-<tokens>-p<p>.json``).

**The rule.** When the study's validation examples are fewer than the power curve asks for its
budget (:meth:`SlopePrior.examples_needed`: the smallest replayed ``n`` whose rate of picks over
budget on test is at most :attr:`SlopePrior.target_rate`; with no power curve recorded, every study
is underpowered), the calibration's slope and its bounds are floored at the prior's
(:meth:`tuner.statistics.calibration.Calibration.floored`): "no cost seen" on a few examples never
reads as less cost than the large grid measured. With enough examples the study's own calibration
decides alone. A floor, not a blend: the prior was measured on other prompts than the user's task,
so it may only make the rule more careful, never less.

**Scaling.** Task-score points per nat depend on how much score there is to lose: a schedule cannot
lose more than the unpruned model scores. A prior with ``scaling = "baseline"`` is read relative to
the grid's unpruned score (:attr:`SlopePrior.baseline_score`) and rescaled to the study's own
(:meth:`SlopePrior.scale`); ``absolute`` applies its points per nat as they are.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.statistics.bootstrap import check_level
from tuner.statistics.shape import LINEAR, check_exponent, slope_unit

PRIOR_DIR = Path(__file__).parent / "priors"
"""Where the packaged priors live, one ``<model>-<tokens>.json`` per model and grid prompt length."""
FORMAT = 1
SCALINGS = ("absolute", "baseline")
COMBINES = ("macro", "steepest")
DEFAULT_TARGET_RATE = 0.10
"""The power curve's target: a study is powered once its pick exceeds the budget on test in at most
this share of replays (issue 30's bar)."""


@dataclass(frozen=True)
class PowerPoint:
    """One row of the power curve (``benchmarks/decision_rule.py`` replaying the study's rule).

    Attributes:
        budget: the task-score budget (points).
        n_examples: validation examples per replay.
        exceed_rate: share of replays whose pick loses more than ``budget`` on test.
        speed_ratio: the pick's speedup over the fastest schedule within budget on test (median).
        replays: how many replays.
    """

    budget: float
    n_examples: int
    exceed_rate: float
    speed_ratio: float | None
    replays: int

    def __post_init__(self) -> None:
        if self.budget <= 0 or self.n_examples < 1 or self.replays < 1:
            raise ValueError(f"power point {self}: budget > 0, n_examples >= 1 and replays >= 1 needed")
        if not 0 <= self.exceed_rate <= 1:
            raise ValueError(f"exceed_rate = {self.exceed_rate}: must be in [0, 1]")


@dataclass(frozen=True)
class SlopePrior:
    """A pooled slope (task-score points per nat of KL) measured on a recorded grid for one model.

    Attributes:
        model: the model it was measured on (a study on another model never reads it).
        task: the grid's task (``openqa``).
        max_prompt_tokens: the grid's prompt length.
        n_examples: validation examples every scored schedule shares.
        schedules: the schedules pooled.
        slope: the pooled ratio through the origin.
        bounds: ``(level, one-sided upper bound)`` from the cluster bootstrap over examples, by level.
        source: the rows file it was fitted on (relative to the repository).
        source_sha256: that file's sha256 when fitted.
        created: ISO date.
        power: the power curve on the same grid (may be empty: not recorded yet).
        target_rate: the power curve's target exceed rate.
        baseline_score: the grid's unpruned score on those examples (points, macro over datasets).
        scaling: ``absolute`` or ``baseline`` (see the module docstring).
        combine: ``macro`` (one slope pooled over the grid's datasets, macro-weighted) or
            ``steepest`` (each dataset's own fit; the slope and every bound are the largest of them:
            a user's task is assumed as sensitive as the most sensitive one measured).
        datasets: per dataset of the grid, ``(name, examples, slope)``.
        exponent: the shape ``p`` it was fitted at (slopes in points per nat^p).
    """

    model: str
    task: str
    max_prompt_tokens: int
    n_examples: int
    schedules: tuple[str, ...]
    slope: float
    bounds: tuple[tuple[float, float], ...]
    source: str
    source_sha256: str
    created: str
    power: tuple[PowerPoint, ...] = ()
    target_rate: float = DEFAULT_TARGET_RATE
    baseline_score: float | None = None
    scaling: str = "absolute"
    combine: str = "macro"
    datasets: tuple[tuple[str, int, float], ...] = ()
    exponent: float = LINEAR
    format: int = field(default=FORMAT)

    def __post_init__(self) -> None:
        if self.format != FORMAT:
            raise ValueError(
                f"slope prior format {self.format}: this version reads format {FORMAT}; rebuild it"
            )
        check_exponent(self.exponent)
        if self.n_examples < 1 or not self.schedules:
            raise ValueError("a slope prior needs examples and schedules")
        if len(self.bounds) < 2:
            raise ValueError("a slope prior needs its bound at two levels or more")
        levels = [lv for lv, _ in self.bounds]
        for lv in levels:
            check_level(lv)
        if levels != sorted(set(levels)):
            raise ValueError("slope prior bounds: levels must be strictly increasing")
        if not 0 < self.target_rate < 1:
            raise ValueError(f"target_rate = {self.target_rate}: must be in (0, 1)")
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling = {self.scaling!r}: must be one of {', '.join(SCALINGS)}")
        if self.combine not in COMBINES:
            raise ValueError(f"combine = {self.combine!r}: must be one of {', '.join(COMBINES)}")
        if self.scaling == "baseline" and not (self.baseline_score or 0) > 0:
            raise ValueError("scaling = 'baseline' needs the grid's baseline_score > 0")

    def scale(self, baseline_score: float | None) -> float:
        """The factor on the prior's slope for a study whose unpruned score is ``baseline_score``
        (points): 1 for ``absolute``; the ratio of the scores for ``baseline`` (a study that does not
        know its score, or scores 0, gets 1 and 0 alike: nothing to lose is no cost)."""
        if self.scaling == "absolute":
            return 1.0
        if baseline_score is None:
            raise ValueError(f"the slope prior {self.id} scales by the unpruned score; give the study's")
        assert self.baseline_score is not None
        return max(baseline_score, 0.0) / self.baseline_score

    @property
    def id(self) -> str:
        """``model/task-tokens@sha`` (the first 12 hex digits of the rows' sha256; ``-p0.5`` after the
        tokens for a prior fitted at another exponent than 1): what a report names."""
        return f"{self.model}/{self.task}-{self.max_prompt_tokens}{exponent_suffix(self.exponent)}@{self.source_sha256[:12]}"

    @property
    def unit(self) -> str:
        """Its slopes' unit (``points per nat``, or ``per nat^p``)."""
        return slope_unit(self.exponent)

    def upper(self, level: float) -> float:
        """The slope's one-sided bound at ``level``, interpolated linearly between recorded levels."""
        check_level(level)
        levels = [lv for lv, _ in self.bounds]
        if not levels[0] <= level <= levels[-1]:
            raise ValueError(
                f"level {level}: the slope prior {self.id} holds bounds for {levels[0]}..{levels[-1]}; rebuild it "
                "with benchmarks/slope_prior.py (levels 0.50..0.99)"
            )
        i = bisect.bisect_left(levels, level)
        if levels[i] == level:
            return self.bounds[i][1]
        (l0, u0), (l1, u1) = self.bounds[i - 1], self.bounds[i]
        return u0 + (u1 - u0) * (level - l0) / (l1 - l0)

    def curve(self, budget: float) -> list[PowerPoint]:
        """The power curve a study with this ``budget`` reads: the rows at the largest recorded budget
        not above it, fewest examples first (empty: no curve for such a budget)."""
        below = [p.budget for p in self.power if p.budget <= budget]
        return sorted((p for p in self.power if below and p.budget == max(below)), key=lambda p: p.n_examples)

    def examples_needed(self, budget: float) -> int | None:
        """The validation examples a study with this ``budget`` needs by the power curve: the smallest
        replayed ``n`` of :meth:`curve` whose exceed rate is at most :attr:`target_rate` (None: no
        curve for such a budget, or no ``n`` reached the target)."""
        return next((p.n_examples for p in self.curve(budget) if p.exceed_rate <= self.target_rate), None)

    def largest_replayed(self, budget: float) -> int | None:
        """The largest ``n`` of :meth:`curve` (None: no curve for such a budget): what "no ``n``
        reached the target" was tried up to."""
        rows = self.curve(budget)
        return rows[-1].n_examples if rows else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "model": self.model,
            "task": self.task,
            "max_prompt_tokens": self.max_prompt_tokens,
            "n_examples": self.n_examples,
            "schedules": list(self.schedules),
            "slope_points_per_nat": self.slope,
            "bounds": [list(b) for b in self.bounds],
            "source": self.source,
            "source_sha256": self.source_sha256,
            "created": self.created,
            "target_rate": self.target_rate,
            "baseline_score": self.baseline_score,
            "scaling": self.scaling,
            "combine": self.combine,
            "datasets": [list(d) for d in self.datasets],
            "exponent": self.exponent,
            "power": [vars(p) for p in self.power],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SlopePrior:
        return cls(
            model=str(data["model"]),
            task=str(data["task"]),
            max_prompt_tokens=int(data["max_prompt_tokens"]),
            n_examples=int(data["n_examples"]),
            schedules=tuple(str(s) for s in data["schedules"]),
            slope=float(data["slope_points_per_nat"]),
            bounds=tuple((float(lv), float(u)) for lv, u in data["bounds"]),
            source=str(data["source"]),
            source_sha256=str(data["source_sha256"]),
            created=str(data["created"]),
            power=tuple(PowerPoint(**p) for p in data.get("power", [])),
            target_rate=float(data.get("target_rate", DEFAULT_TARGET_RATE)),
            baseline_score=None if data.get("baseline_score") is None else float(data["baseline_score"]),
            scaling=str(data.get("scaling", "absolute")),
            combine=str(data.get("combine", "macro")),
            datasets=tuple((str(d[0]), int(d[1]), float(d[2])) for d in data.get("datasets", [])),
            exponent=float(data.get("exponent", LINEAR)),
            format=int(data["format"]),
        )

    @classmethod
    def load(cls, path: str | Path) -> SlopePrior:
        """Read a prior file; any problem is one ``ValueError`` line naming the file."""
        p = Path(path)
        try:
            return cls.from_dict(json.loads(p.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise ValueError(f"slope prior {p}: no such file") from None
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"slope prior {p}: not a slope prior file ({type(e).__name__}: {e})") from None

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        return p


def exponent_suffix(exponent: float) -> str:
    """What a prior's file name and id add for its exponent: nothing at 1, ``-p0.5`` at 0.5."""
    return "" if exponent == LINEAR else f"-p{exponent:g}"


def packaged_all(model: str, exponent: float = LINEAR) -> list[SlopePrior]:
    """Every prior shipped for ``model`` at ``exponent`` (one per recorded prompt length), shortest
    prompts first."""
    found = [SlopePrior.load(p) for p in sorted(PRIOR_DIR.glob("*.json"))] if PRIOR_DIR.exists() else []
    return sorted(
        (p for p in found if p.model == model and p.exponent == exponent), key=lambda p: p.max_prompt_tokens
    )


def nearest(priors: Sequence[SlopePrior], max_prompt_tokens: int | None) -> SlopePrior | None:
    """The prior measured at the prompt length nearest ``max_prompt_tokens`` (by ratio; a tie goes to
    the shorter: drift shrinks as prompts grow, so the shorter grid's slope is the careful one), or
    the shortest where the length is not given; None when there is none. A model drifts differently
    at different lengths (docs/benchmarks.md#scoring-ablation), so a study reads the grid nearest its own."""
    if not priors:
        return None
    if max_prompt_tokens is None:
        return min(priors, key=lambda p: p.max_prompt_tokens)
    target = max(int(max_prompt_tokens), 1)
    return min(priors, key=lambda p: (abs(math.log(p.max_prompt_tokens / target)), p.max_prompt_tokens))


def packaged(model: str, max_prompt_tokens: int | None = None, exponent: float = LINEAR) -> SlopePrior | None:
    """The prior shipped for ``model`` at ``exponent`` nearest ``max_prompt_tokens`` (:func:`nearest`;
    None when none is)."""
    return nearest(packaged_all(model, exponent), max_prompt_tokens)


def resolve(
    spec: str, model: str, max_prompt_tokens: int | None = None, exponent: float = LINEAR
) -> SlopePrior | None:
    """``--slope-prior``: ``auto`` (the packaged prior of ``model`` at the calibration's ``exponent``
    nearest the study's prompt length, if any), ``none``, or a file path (its model must be ``model``,
    its exponent ``exponent``)."""
    if spec == "none":
        return None
    if spec == "auto":
        return packaged(model, max_prompt_tokens, exponent)
    prior = SlopePrior.load(spec)
    if prior.model != model:
        raise ValueError(
            f"slope_prior = {spec!r} was measured on {prior.model!r}, not {model!r}; give that model's prior, "
            "auto or none"
        )
    if prior.exponent != exponent:
        raise ValueError(
            f"slope_prior = {spec!r} was fitted at exponent {prior.exponent:g}, the calibration's is {exponent:g}; "
            "give a prior fitted at that exponent (benchmarks/slope_prior.py --exponent), auto or none"
        )
    return prior


def packaged_path(model: str, max_prompt_tokens: int, exponent: float = LINEAR) -> Path:
    """Where ``benchmarks/slope_prior.py`` stores ``model``'s prior for one prompt length and exponent."""
    return PRIOR_DIR / f"{model}-{max_prompt_tokens}{exponent_suffix(exponent)}.json"


def sha256_of(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def power_points(rows: Sequence[Mapping[str, Any]]) -> tuple[PowerPoint, ...]:
    """Power points from ``benchmarks/decision_rule.py``'s power rows (``budget``, ``n``, ``exceed_rate``,
    ``speed_ratio``, ``replays``)."""
    return tuple(
        PowerPoint(
            budget=float(r["budget"]),
            n_examples=int(r["n"]),
            exceed_rate=float(r["exceed_rate"]),
            speed_ratio=None if r.get("speed_ratio") is None else float(r["speed_ratio"]),
            replays=int(r["replays"]),
        )
        for r in rows
    )
