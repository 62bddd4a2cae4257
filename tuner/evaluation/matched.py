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
   search measures them (:meth:`tuner.evaluation.runner.Evaluator.measure_speed`, :mod:`tuner.evaluation.speed`: on the
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

import csv
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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


def interval_text(est: Estimate) -> str:
    """``+1.25 [-0.50, +3.00]``: a loss and its interval, score points."""
    return f"{est.value:+.2f} [{est.low:+.2f}, {est.high:+.2f}]"


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
                rows = [ExampleResult(**json.loads(line)) for line in path.read_text().splitlines() if line]
                speed: MethodSpeed | None = MethodSpeed.from_dict(json.loads(speed_path.read_text()))
            except (ValueError, TypeError, KeyError):
                rows, speed = [], None
            if speed is not None and [(r.dataset, r.record_id) for r in rows] == list(keys):
                return Evaluated(rows, speed)
        done = runner(method, options)
        cache_dir.mkdir(parents=True, exist_ok=True)
        for target, text in (
            (path, "".join(json.dumps(asdict(r)) + "\n" for r in done.results)),
            (speed_path, json.dumps(done.speed.to_dict(), indent=1)),
        ):
            write_atomic(target, text)
        key.write_text(fingerprint)
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


def compare(
    runner: Runner,
    baseline: Sequence[ExampleResult],
    schedule: Schedule,
    dims: ModelDims,
    lengths: Sequence[int],
    *,
    peers: Sequence[str] = DEFAULT_PEERS,
    fixed: Mapping[str, Mapping[str, float]] | None = None,
    sweep: Sequence[float] = SWEEP_SHARES,
    level: float = DEFAULT_LEVEL,
) -> MatchedReport:
    """Evaluate the tuned schedule, each peer at the matched speedup and along its sweep (see the module
    docstring). ``fixed`` holds per-peer knobs to keep (e.g. ``{"gemfilter": {"r": 10}}``); ``level``:
    of every interval (Table 3's)."""
    fixed = fixed or {}
    tuned_run = runner("lazyllm", {})
    tuned_res = tuned_run.results

    def point(method: str, options: Mapping[str, float], role: str, done: Evaluated) -> Point:
        res = done.results
        return Point(
            label=label_of(method, options) if role != "tuned" else "tuned schedule",
            method=method,
            options=dict(options),
            role=role,
            n=len(res),
            score=macro_score(res),
            vs_baseline=loss_estimate(res, baseline, level=level),
            vs_tuned=None if role == "tuned" else loss_estimate(res, tuned_res, level=level),
            flop_speedup=median_flop_speedup(method, options, schedule, dims, lengths),
            ttft_speedup=done.speed.ttft.speedup,
            speed=done.speed,
        )

    tuned = point("lazyllm", {}, "tuned", tuned_run)
    target = tuned.flop_speedup
    n_mid = int(statistics.median(lengths))
    points = [tuned]
    unreachable: dict[str, float] = {}
    for method in peers:
        size_knob = method_spec(method).size_knob
        if size_knob is None:
            raise ValueError(f"method {method!r} has no size knob to match; peers: {', '.join(peer_names())}")
        knobs = dict(fixed.get(method, {}))
        knobs.pop(size_knob, None)
        matched = match_speedup(method, dims, n_mid, target, knobs)
        if matched is None:  # even one kept token is slower than the target
            unreachable[method] = peer_flop_speedup(method, dims, n_mid, {**knobs, size_knob: 1 / n_mid})
        else:
            matched = {k: round(v, 4) for k, v in matched.items()}
            points.append(point(method, matched, "matched", runner(method, matched)))
        for share in sweep:
            options = {**knobs, size_knob: share}
            points.append(point(method, options, "sweep", runner(method, options)))
    at_loss: dict[str, dict[str, float | None]] = {}
    for method in peers:
        curve = [p for p in points if p.method == method]
        at_loss[method] = {
            kind: speedup_at_loss(curve, tuned.loss, kind) for kind in ("flop_speedup", "ttft_speedup")
        }
    return MatchedReport(
        n=len(tuned_res),
        level=level,
        target_flop_speedup=target,
        tuned=tuned,
        baseline_score=macro_score(baseline),
        points=points,
        at_loss=at_loss,
        unreachable=unreachable,
        rules={"tuned schedule": f"scoring {schedule.scoring}"}
        | {method: method_spec(method).rule for method in peers},
    )


# Writing ------------------------------------------------------------------------------------------
def rows(report: MatchedReport) -> list[dict[str, Any]]:
    """One CSV row per point; losses are reference - point (score points, positive = worse)."""
    out = []
    for p in report.points:
        row: dict[str, Any] = {
            "label": p.label,
            "method": p.method,
            "role": p.role,
            "options": json.dumps(p.options, sort_keys=True),
            "n": p.n,
            "score": round(p.score, 2),
        }
        for name, est in (("loss_vs_baseline", p.vs_baseline), ("loss_vs_tuned", p.vs_tuned)):
            row[name] = None if est is None else round(est.value, 2)
            row[f"{name}_low"] = None if est is None else round(est.low, 2)
            row[f"{name}_high"] = None if est is None else round(est.high, 2)
        row.update(
            interval_level=report.level,
            flop_speedup=round(p.flop_speedup, 3),
            ttft_speedup=round(p.ttft_speedup, 3),
            timing_clock=p.speed.clock if p.speed else "",
            timing_rounds=p.speed.ttft.rounds if p.speed else 0,
        )
        out.append(row)
    return out


def markdown(report: MatchedReport, header: str) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    def vs(est: Estimate | None) -> str:
        return "-" if est is None else interval_text(est)

    timed = [p.speed for p in report.points if p.speed is not None]
    clocks = ", ".join(sorted({s.clock for s in timed})) or "-"
    rounds = sorted({s.ttft.rounds for s in timed}) or [0]
    timing = (
        f"measured TTFT speedups by tuner.evaluation.speed: clock {clocks}, "
        f"{rounds[0] if len(rounds) == 1 else f'{rounds[0]}-{rounds[-1]}'} interleaved rounds per side "
        f"(minimum per side) on the example of median prompt length"
    )
    lines = [
        header,
        "",
        f"**Matched speed**: every peer's size knob set to the tuned schedule's FLOP-model speedup "
        f"{report.target_flop_speedup:.2f}x (n = {report.n} examples; unpruned score "
        f"{report.baseline_score:.2f}; loss = reference - method in score points, positive = worse, "
        f"{report.level:.0%} paired bootstrap interval as in Table 3; {timing})",
        "",
        "| method | knobs | n | score | loss vs unpruned | loss vs tuned | FLOP speedup | measured TTFT speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in report.points:
        if p.role not in ("tuned", "matched"):
            continue
        knobs = ", ".join(f"{k}={v:g}" for k, v in sorted(p.options.items())) or "-"
        lines.append(
            f"| {p.label if p.role == 'matched' else 'tuned schedule (lazyllm)'} | {knobs} | {p.n} | "
            f"{p.score:.2f} | {vs(p.vs_baseline)} | {vs(p.vs_tuned)} | {p.flop_speedup:.2f}x | "
            f"{p.ttft_speedup:.2f}x |"
        )
    for method, best in report.unreachable.items():
        lines.append(f"| {method} | - | - | unreachable: at most {best:.2f}x with one token kept | | | | |")
    if report.rules:
        lines += ["", "**Scoring rules**", ""]
        lines += [f"- {method}: {rule}" for method, rule in report.rules.items()]
    lines += [
        "",
        f"**Matched loss**: each method's speedup at the tuned schedule's loss "
        f"({report.tuned.loss:+.2f} points), read off its knob sweep",
        "",
        "| method | FLOP speedup at that loss | measured TTFT speedup at that loss |",
        "|---|---|---|",
        f"| tuned schedule | {report.tuned.flop_speedup:.2f}x | {report.tuned.ttft_speedup:.2f}x |",
    ]
    for method, speeds in report.at_loss.items():
        lines.append(f"| {method} | {fmt(speeds['flop_speedup'])} | {fmt(speeds['ttft_speedup'])} |")
    lines += [
        "",
        "**All points** (also in matched.csv)",
        "",
        "| point | n | score | loss vs unpruned | loss vs tuned | FLOP | TTFT |",
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for p in report.points:
        lines.append(
            f"| {p.label} | {p.n} | {p.score:.2f} | {vs(p.vs_baseline)} | {vs(p.vs_tuned)} | "
            f"{p.flop_speedup:.2f}x | {p.ttft_speedup:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def plot(report: MatchedReport, path: Path, title: str) -> None:
    """Score vs speedup, FLOP model (left) and measured TTFT (right): a curve per method, tuned on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    methods = list(dict.fromkeys(p.method for p in report.points if p.role != "tuned"))
    for ax, kind, name in zip(
        axes, ("flop_speedup", "ttft_speedup"), ("FLOP-model prefill", "measured TTFT")
    ):
        for i, method in enumerate(methods):
            curve = sorted((p for p in report.points if p.method == method), key=lambda p: getattr(p, kind))
            xs = [getattr(p, kind) for p in curve]
            ax.plot(xs, [p.score for p in curve], "o-", c=f"C{i}", label=method, alpha=0.8)
            for p in curve:
                if p.role == "matched":
                    ax.scatter(getattr(p, kind), p.score, s=110, facecolors="none", edgecolors=f"C{i}")
        t = report.tuned
        ax.scatter(getattr(t, kind), t.score, marker="*", s=260, c="k", zorder=5, label="tuned schedule")
        ax.axhline(report.baseline_score, ls="--", c="gray", lw=1, label="unpruned")
        what = (
            "median over examples"
            if kind == "flop_speedup"
            else "tuner.evaluation.speed, median-length example"
        )
        ax.set_xlabel(f"{name} speedup (x, {what})")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("score (macro over datasets)")
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(
        f"{title}: n = {report.n} examples per point (circled: matched to the tuned speedup)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(report: MatchedReport, out_dir: Path, header: str, title: str) -> str:
    """``matched.md``, ``matched.csv``, ``matched.png``; returns the markdown."""
    text = markdown(report, header)
    (out_dir / "matched.md").write_text(text)
    table = rows(report)
    with (out_dir / "matched.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    plot(report, out_dir / "matched.png", title)
    return text


def run(
    settings: EvaluateSettings,
    evaluator: Evaluator,
    schedule: Schedule,
    baseline: Sequence[ExampleResult],
    known: Mapping[str, Evaluated] | None = None,
) -> str:
    """The ``--match-speedup`` part of ``python -m tuner.evaluate``: compare, write, return the markdown.

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
    peers = [m for m in settings.method_list if m in peer_names()] or list(DEFAULT_PEERS)
    report = compare(
        cached_run(runner, out / "matched", keys, fingerprint),
        baseline,
        schedule,
        dims,
        [len(ex.input_ids) for ex in evaluator.examples],
        peers=peers,
        fixed=settings.options_by_method,
    )
    header = (
        f"model {settings.model}, task {settings.task} ({settings.language}), split {settings.split}, "
        f"prompts cut to {settings.max_prompt_tokens} tokens, schedule {settings.schedule}"
    )
    return write(report, out, header, f"{settings.model_slug} {settings.task} {settings.split}")
