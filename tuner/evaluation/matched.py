"""Tuned schedule vs peers at matched speed: ``python -m tuner.evaluate ... --match-speedup``.

For the tuned LazyLLM schedule (``--schedule``) on the evaluation examples:

1. **Same speedup.** Its FLOP-model prefill speedup (median over the examples' prompt lengths) is
   the target; each peer (:mod:`lazyllm.peers`: GemFilter, TSP, with their published scoring rules)
   gets the size knob that reaches the
   target while keeping the most tokens (:meth:`lazyllm.peers.base.Peer.match_speedup`, at the median prompt
   length; the other knobs as ``--method-options`` give them, paper defaults otherwise). Each is
   evaluated on the same examples as the tuned schedule, and the table shows score, the accuracy
   loss against the unpruned baseline and against the tuned schedule with paired bootstrap intervals,
   and FLOP and measured TTFT speedups side by side. Matching is on the FLOP model because it is
   deterministic; the measured speedups show how well it carries over. They are measured as the
   search measures them (:meth:`tuner.evaluation.runner.Evaluator.measure_speed`, :mod:`tuner.statistics.speed`: on the
   example of median prompt length, interleaved rounds, minimum per side, the CPU thread clock on a
   CPU); the report names the clock and the rounds.
2. **Same loss.** Each peer runs at a few settings of its size knob (:data:`SWEEP_SHARES`); its speedup at
   the tuned schedule's accuracy loss is read off that curve (linear interpolation between the two
   settings around the loss; None if no setting is that accurate).
3. **Plot.** Score against speedup (FLOP model and measured, one panel each): one curve per method,
   the tuned schedule on top, the unpruned score as a line, sample counts in the title.

Results per (method, knobs) are cached as ``<label>.jsonl`` (and the timing as ``<label>.speed.json``)
in the output folder and reused when their examples match, so the work can be split over several runs
(e.g. ``--methods`` one peer at a time). Intervals are those of Table 3
(:func:`tuner.evaluation.runner.loss_estimate`: the one paired bootstrap of :mod:`tuner.statistics.bootstrap`, same level,
same draws), so a schedule shows one interval in the whole report. Sign: loss = reference - method,
positive = worse.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lazyllm.atomic import write_atomic
from lazyllm.flops import ModelDims
from lazyllm.methods import make_method, peer_names
from lazyllm.methods import method as method_spec
from lazyllm.peers import PEERS, match_speedup, peer_flop_speedup
from lazyllm.schedule import Schedule
from tuner.evaluation.runner import Evaluator, ExampleResult, MethodSpeed, loss_estimate, macro_score
from tuner.statistics.bootstrap import DEFAULT_LEVEL, Estimate
from tuner.study.settings import EvaluateSettings

SWEEP_SHARES: tuple[float, ...] = (0.1, 0.3, 0.6)
"""Size-knob settings (shares of the prompt kept) each peer's curve runs at."""
DEFAULT_PEERS = tuple(p.name for p in PEERS.values() if p.published)
"""The peers compared when ``--methods`` names none: the published configurations (gemfilter, tsp)."""


@dataclass(frozen=True)
class Point:
    """One method at one knob setting on the evaluation examples.

    Attributes:
        label: method and knobs (also the name of its ``.jsonl`` file).
        method: registry name. options: its knobs. role: "tuned", "matched", "sweep" or "baseline".
        n: examples. score: macro score. vs_baseline / vs_tuned: accuracy loss against the unpruned
        model / the tuned schedule (reference - this, score points, positive = worse) with its paired
        bootstrap interval (None against itself).
        flop_speedup: median FLOP-model prefill speedup over the examples. ttft_speedup: measured TTFT
        speedup (``speed``: its evidence, clock and rounds; None where not measured).
    """

    label: str
    method: str
    options: dict[str, float]
    role: str
    n: int
    score: float
    vs_baseline: Estimate | None
    vs_tuned: Estimate | None
    flop_speedup: float
    ttft_speedup: float
    speed: MethodSpeed | None = None

    @property
    def loss(self) -> float:
        return self.vs_baseline.value if self.vs_baseline is not None else 0.0


def label_of(method: str, options: Mapping[str, float]) -> str:
    """``gemfilter_k0.3_r12``: method and knobs, sorted, safe as a file name."""
    parts = [f"{k}{float(v):g}" for k, v in sorted(options.items())]
    return "_".join([method, *parts])


def median_flop_speedup(
    method: str,
    options: Mapping[str, float],
    schedule: Schedule | None,
    dims: ModelDims,
    lengths: Sequence[int],
) -> float:
    """Median over prompt lengths of the FLOP-model prefill speedup of a method at its knobs (the
    method's own FLOP model, :attr:`lazyllm.methods.Method.flops`)."""
    spec = method_spec(method)
    return float(statistics.median(spec.flop_speedup(dims, n, schedule, options) for n in lengths))


def speedup_at_loss(points: Sequence[Point], loss: float, kind: str = "flop_speedup") -> float | None:
    """The speedup at which a method's curve reaches accuracy loss ``loss``: the fastest point whose
    loss is at most ``loss``, pushed towards the next faster point by linear interpolation. None if no
    point is that accurate."""
    curve = sorted(points, key=lambda p: getattr(p, kind))
    best: float | None = None
    for i, p in enumerate(curve):
        if p.loss <= loss:
            speed = float(getattr(p, kind))
            if i + 1 < len(curve) and curve[i + 1].loss > loss:
                q = curve[i + 1]
                t = (loss - p.loss) / (q.loss - p.loss)
                speed += t * (float(getattr(q, kind)) - speed)
            best = speed if best is None else max(best, speed)
    return best


# Running and caching -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Evaluated:
    """One method at one knob setting: per-example results and its measured speedups."""

    results: list[ExampleResult]
    speed: MethodSpeed


Runner = Callable[[str, Mapping[str, float]], Evaluated]
"""Evaluates ``(method, options)`` on the examples (the CLI builds the generator and the Evaluator)."""


def cached_run(runner: Runner, cache_dir: Path, keys: Sequence[tuple[str, str]], fingerprint: str) -> Runner:
    """Wrap ``runner`` so results are read from / written to ``cache_dir/<label>.jsonl`` (the timing
    to ``<label>.speed.json``); they are reused only if ``<label>.key`` holds the same ``fingerprint``
    (settings, schedule) and the rows are the same examples in the same order."""

    def run(method: str, options: Mapping[str, float]) -> Evaluated:
        label = label_of(method, options)
        path, key = cache_dir / f"{label}.jsonl", cache_dir / f"{label}.key"
        speed_path = cache_dir / f"{label}.speed.json"
        if path.exists() and key.exists() and speed_path.exists() and key.read_text() == fingerprint:
            try:
                rows = ExampleResult.read_jsonl(path)
                speed: MethodSpeed | None = MethodSpeed.from_dict(json.loads(speed_path.read_text()))
            except (ValueError, TypeError, KeyError):
                rows, speed = [], None
            if speed is not None and [(r.dataset, r.record_id) for r in rows] == list(keys):
                return Evaluated(rows, speed)
        done = runner(method, options)
        cache_dir.mkdir(parents=True, exist_ok=True)
        for target, text in (
            (path, ExampleResult.to_jsonl(done.results)),
            (speed_path, json.dumps(done.speed.to_dict(), indent=1)),
        ):
            write_atomic(target, text)
        write_atomic(key, fingerprint)
        return done

    return run


@dataclass(frozen=True)
class MatchedReport:
    """What ``--match-speedup`` found: every point, the matched peers, and speedups at the tuned loss.
    ``level``: the confidence level of every interval."""

    n: int
    level: float
    target_flop_speedup: float
    tuned: Point
    baseline_score: float
    points: list[Point]
    at_loss: dict[str, dict[str, float | None]]
    unreachable: dict[str, float]
    rules: dict[str, str] = field(default_factory=dict)
    """How each method scores tokens (its source and rule; the tuned schedule's own rule)."""


@dataclass(frozen=True)
class MatchRequest:
    """What to compare the tuned schedule with, on which examples.

    Attributes:
        baseline: the unpruned results on the evaluation examples. schedule: the tuned schedule.
        dims: the model's FLOP-model dimensions. lengths: the examples' prompt lengths (the FLOP
        speedups are medians over them; the peers are matched at their median).
        peers: methods to match (each needs a size knob). fixed: per-peer knobs to keep (e.g.
        ``{"gemfilter": {"r": 10}}``). sweep: size-knob settings of each peer's curve.
        level: of every interval (Table 3's).
    """

    baseline: tuple[ExampleResult, ...]
    schedule: Schedule
    dims: ModelDims
    lengths: tuple[int, ...]
    peers: tuple[str, ...] = DEFAULT_PEERS
    fixed: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    sweep: tuple[float, ...] = SWEEP_SHARES
    level: float = DEFAULT_LEVEL

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("no prompt lengths to match speedups at: the comparison needs examples")
        for method in self.peers:
            if method_spec(method).size_knob is None:
                raise ValueError(
                    f"method {method!r} has no size knob to match; peers: {', '.join(peer_names())}"
                )

    @property
    def median_length(self) -> int:
        return int(statistics.median(self.lengths))


def compare(runner: Runner, request: MatchRequest) -> MatchedReport:
    """Evaluate the tuned schedule, each peer at the matched speedup and along its sweep (see the module
    docstring), and read each peer's speedup at the tuned schedule's loss off its curve."""
    tuned_run = runner("lazyllm", {})
    tuned = _point(request, tuned_run.results, "lazyllm", {}, "tuned", tuned_run)
    points = [tuned]
    unreachable: dict[str, float] = {}
    for method in request.peers:
        peer_points, best = _peer_points(runner, request, tuned_run.results, tuned.flop_speedup, method)
        points += peer_points
        if best is not None:
            unreachable[method] = best
    return MatchedReport(
        n=len(tuned_run.results),
        level=request.level,
        target_flop_speedup=tuned.flop_speedup,
        tuned=tuned,
        baseline_score=macro_score(request.baseline),
        points=points,
        at_loss=_speedups_at_loss(points, request.peers, tuned.loss),
        unreachable=unreachable,
        rules={"tuned schedule": f"scoring {request.schedule.scoring}"}
        | {method: method_spec(method).rule for method in request.peers},
    )


def _point(
    request: MatchRequest,
    tuned: Sequence[ExampleResult],
    method: str,
    options: Mapping[str, float],
    role: str,
    done: Evaluated,
) -> Point:
    """One evaluated setting scored against the baseline and the tuned schedule's ``tuned`` results."""
    res = done.results
    return Point(
        label=label_of(method, options) if role != "tuned" else "tuned schedule",
        method=method,
        options=dict(options),
        role=role,
        n=len(res),
        score=macro_score(res),
        vs_baseline=loss_estimate(res, request.baseline, level=request.level),
        vs_tuned=None if role == "tuned" else loss_estimate(res, tuned, level=request.level),
        flop_speedup=median_flop_speedup(method, options, request.schedule, request.dims, request.lengths),
        ttft_speedup=done.speed.ttft.speedup,
        speed=done.speed,
    )


def _peer_points(
    runner: Runner, request: MatchRequest, tuned: Sequence[ExampleResult], target: float, method: str
) -> tuple[list[Point], float | None]:
    """A peer at the size knob that matches the ``target`` FLOP speedup, then along its sweep; and,
    when no knob reaches the target, the best speedup it has (one token kept) instead of a matched point."""
    size_knob = method_spec(method).size_knob
    assert size_knob is not None  # checked by MatchRequest
    n_mid = request.median_length
    knobs = dict(request.fixed.get(method, {}))
    knobs.pop(size_knob, None)
    points: list[Point] = []
    unreachable = None
    matched = match_speedup(method, request.dims, n_mid, target, knobs)
    if matched is None:  # even one kept token is slower than the target
        unreachable = peer_flop_speedup(method, request.dims, n_mid, {**knobs, size_knob: 1 / n_mid})
    else:
        matched = {k: round(v, 4) for k, v in matched.items()}
        points.append(_point(request, tuned, method, matched, "matched", runner(method, matched)))
    for share in request.sweep:
        options = {**knobs, size_knob: share}
        points.append(_point(request, tuned, method, options, "sweep", runner(method, options)))
    return points, unreachable


def _speedups_at_loss(
    points: Sequence[Point], peers: Sequence[str], loss: float
) -> dict[str, dict[str, float | None]]:
    """Per peer: its FLOP and measured TTFT speedups at accuracy loss ``loss``, off its curve."""
    return {
        method: {
            kind: speedup_at_loss([p for p in points if p.method == method], loss, kind)
            for kind in ("flop_speedup", "ttft_speedup")
        }
        for method in peers
    }


def run(
    settings: EvaluateSettings,
    evaluator: Evaluator,
    schedule: Schedule,
    baseline: Sequence[ExampleResult],
    known: Mapping[str, Evaluated] | None = None,
) -> MatchedReport:
    """The ``--match-speedup`` part of ``python -m tuner.evaluate``: the comparison, from its cache
    where it holds them (the report is written by :func:`tuner.report.matched.write`).

    Peers come from ``--methods`` (:data:`DEFAULT_PEERS` if it names none); their
    ``--method-options`` other than the size knob stay fixed. ``known``: results and timing the caller has
    for a method at its default knobs on the same examples (e.g. ``lazyllm``), used instead of rerunning.
    """
    known = known or {}
    model, tokenizer = evaluator.model, evaluator.tokenizer
    out = settings.out_dir
    dims = ModelDims.from_config(model.config)
    timing = evaluator.timing_example()

    def runner(method: str, options: Mapping[str, float]) -> Evaluated:
        if not options and method in known:
            return known[method]
        generator = make_method(method, model, tokenizer, schedule, seed=settings.seed, options=options)
        results, _ = evaluator.evaluate(label_of(method, options), generator)
        flops = median_flop_speedup(method, options, schedule, dims, [len(timing.input_ids)])
        speed = evaluator.measure_speed(
            generator, timing, flops, rounds=settings.timing_rounds, clock=settings.timing_clock
        )
        return Evaluated(results, speed)

    fingerprint = json.dumps(
        {"eval": asdict(settings.eval_only()), "schedule": schedule.to_dict(), "seed": settings.seed},
        sort_keys=True,
    )
    keys = [(ex.dataset, ex.record_id) for ex in evaluator.examples]
    request = MatchRequest(
        baseline=tuple(baseline),
        schedule=schedule,
        dims=dims,
        lengths=tuple(len(ex.input_ids) for ex in evaluator.examples),
        peers=tuple(m for m in settings.method_list if m in peer_names()) or DEFAULT_PEERS,
        fixed=settings.options_by_method,
    )
    return compare(cached_run(runner, out / "matched", keys, fingerprint), request)
