"""Tuned schedule vs peers at matched speed: ``python -m tuner.evaluate ... --match-speedup``.

For the tuned LazyLLM schedule (``--schedule``) on the evaluation examples:

1. **Same speedup.** Its FLOP-model prefill speedup (median over the examples' prompt lengths) is
   the target; each peer (:mod:`lazyllm.peers`: GemFilter, TSP, with their published scoring rules)
   gets the size knob that reaches the
   target while keeping the most tokens (:meth:`lazyllm.peers.base.Peer.match_speedup`, at the median prompt
   length; the other knobs as ``--method-options`` give them, paper defaults otherwise). Each is
   evaluated on the same examples as the tuned schedule, and the table shows score, paired
   bootstrap intervals of the score difference against the unpruned baseline and against the tuned
   schedule, and FLOP and measured (median paired TTFT) speedups side by side. Matching is on the
   FLOP model because it is deterministic; the measured speedups show how well it carries over.
2. **Same loss.** Each peer runs at a few settings of its size knob (:data:`SWEEP_SHARES`); its speedup at
   the tuned schedule's accuracy loss is read off that curve (linear interpolation between the two
   settings around the loss; None if no setting is that accurate).
3. **Plot.** Score against speedup (FLOP model and measured, one panel each): one curve per method,
   the tuned schedule on top, the unpruned score as a line, sample counts in the title.

Results per (method, knobs) are cached as ``<label>.jsonl`` in the output folder and reused when their
examples match, so the work can be split over several runs (e.g. ``--methods`` one peer at a time).
Intervals: examples are resampled with replacement within each dataset (the same draw for both
sides of a pair), the macro score over datasets recomputed, 2000 draws, 2.5th and 97.5th percentiles.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lazyllm.flops import ModelDims
from lazyllm.methods import make_method, peer_names
from lazyllm.methods import method as method_spec
from lazyllm.peers import PEERS, match_speedup, peer_flop_speedup
from lazyllm.schedule import Schedule
from tuner.evaluation import Evaluator, ExampleResult, macro_score
from tuner.settings import EvaluateSettings

SWEEP_SHARES: tuple[float, ...] = (0.1, 0.3, 0.6)
"""Size-knob settings (shares of the prompt kept) each peer's curve runs at."""
DEFAULT_PEERS = tuple(p.name for p in PEERS.values() if p.published)
"""The peers compared when ``--methods`` names none: the published configurations (gemfilter, tsp)."""
BOOTSTRAP_DRAWS = 2000


@dataclass(frozen=True)
class Interval:
    """A paired bootstrap estimate: the observed difference and its 95% interval (score points)."""

    value: float
    low: float
    high: float

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise ValueError(f"interval [{self.low}, {self.high}] is empty")

    def __str__(self) -> str:
        return f"{self.value:+.2f} [{self.low:+.2f}, {self.high:+.2f}]"


def _macro(scores: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """Macro score (100 x mean per dataset, averaged) for each row of ``scores`` ``[draws, n]``."""
    return np.mean([100 * scores[:, g].mean(axis=1) for g in groups], axis=0)


def paired_bootstrap(
    results: Sequence[ExampleResult],
    reference: Sequence[ExampleResult],
    *,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
) -> Interval:
    """Macro score of ``results`` minus that of ``reference`` on the same examples, with a 95% interval
    from resampling examples within each dataset (the same draw for both sides)."""
    ref = {(r.dataset, r.record_id): r.score for r in reference}
    missing = [(r.dataset, r.record_id) for r in results if (r.dataset, r.record_id) not in ref]
    if missing or not results:
        raise ValueError(f"paired bootstrap needs the same examples on both sides; unmatched: {missing[:3]}")
    datasets = sorted({r.dataset for r in results})
    a = np.array([r.score for r in results], dtype=float)
    b = np.array([ref[(r.dataset, r.record_id)] for r in results], dtype=float)
    index = [np.array([i for i, r in enumerate(results) if r.dataset == d]) for d in datasets]
    rng = np.random.default_rng(seed)
    draws_idx = np.concatenate(
        [rng.choice(g, size=(draws, g.size), replace=True) for g in index], axis=1
    )  # [draws, n]: column j resamples within the dataset of position j
    spans, start = [], 0
    for g in index:
        spans.append(np.arange(start, start + g.size))
        start += g.size
    diff = _macro(a[draws_idx], spans) - _macro(b[draws_idx], spans)
    observed = float(
        _macro(a[None, np.concatenate(index)], spans)[0] - _macro(b[None, np.concatenate(index)], spans)[0]
    )
    low, high = np.percentile(diff, [2.5, 97.5])
    return Interval(observed, float(min(low, observed)), float(max(high, observed)))


@dataclass(frozen=True)
class Point:
    """One method at one knob setting on the evaluation examples.

    Attributes:
        label: method and knobs (also the name of its ``.jsonl`` file).
        method: registry name. options: its knobs. role: "tuned", "matched", "sweep" or "baseline".
        n: examples. score: macro score. vs_baseline / vs_tuned: paired intervals (None for themselves).
        flop_speedup: median FLOP-model prefill speedup over the examples. ttft_speedup: median
        measured paired TTFT speedup.
    """

    label: str
    method: str
    options: dict[str, float]
    role: str
    n: int
    score: float
    vs_baseline: Interval | None
    vs_tuned: Interval | None
    flop_speedup: float
    ttft_speedup: float

    @property
    def loss(self) -> float:
        return -self.vs_baseline.value if self.vs_baseline is not None else 0.0


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
Runner = Callable[[str, Mapping[str, float]], list[ExampleResult]]
"""Evaluates ``(method, options)`` on the examples (the CLI builds the generator and the Evaluator)."""


def cached_run(runner: Runner, cache_dir: Path, keys: Sequence[tuple[str, str]], fingerprint: str) -> Runner:
    """Wrap ``runner`` so results are read from / written to ``cache_dir/<label>.jsonl``; a file is
    reused only if its ``<label>.key`` holds the same ``fingerprint`` (settings, schedule) and its rows
    are the same examples in the same order."""

    def run(method: str, options: Mapping[str, float]) -> list[ExampleResult]:
        label = label_of(method, options)
        path, key = cache_dir / f"{label}.jsonl", cache_dir / f"{label}.key"
        if path.exists() and key.exists() and key.read_text() == fingerprint:
            try:
                rows = [ExampleResult(**json.loads(line)) for line in path.read_text().splitlines() if line]
            except (ValueError, TypeError):
                rows = []
            if [(r.dataset, r.record_id) for r in rows] == list(keys):
                return rows
        rows = runner(method, options)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
        tmp.replace(path)
        key.write_text(fingerprint)
        return rows

    return run


@dataclass(frozen=True)
class MatchedReport:
    """What ``--match-speedup`` found: every point, the matched peers, and speedups at the tuned loss."""

    n: int
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
) -> MatchedReport:
    """Evaluate the tuned schedule, each peer at the matched speedup and along its sweep (see the module
    docstring). ``fixed`` holds per-peer knobs to keep (e.g. ``{"gemfilter": {"r": 10}}``)."""
    fixed = fixed or {}
    tuned_res = runner("lazyllm", {})

    def point(method: str, options: Mapping[str, float], role: str, res: Sequence[ExampleResult]) -> Point:
        return Point(
            label=label_of(method, options) if role != "tuned" else "tuned schedule",
            method=method,
            options=dict(options),
            role=role,
            n=len(res),
            score=macro_score(res),
            vs_baseline=paired_bootstrap(res, baseline),
            vs_tuned=None if role == "tuned" else paired_bootstrap(res, tuned_res),
            flop_speedup=median_flop_speedup(method, options, schedule, dims, lengths),
            ttft_speedup=float(statistics.median(r.ttft_speedup for r in res)),
        )

    tuned = point("lazyllm", {}, "tuned", tuned_res)
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
    """One CSV row per point."""
    out = []
    for p in report.points:
        out.append(
            {
                "label": p.label,
                "method": p.method,
                "role": p.role,
                "options": json.dumps(p.options, sort_keys=True),
                "n": p.n,
                "score": round(p.score, 2),
                "delta_vs_baseline": None if p.vs_baseline is None else round(p.vs_baseline.value, 2),
                "delta_vs_baseline_low": None if p.vs_baseline is None else round(p.vs_baseline.low, 2),
                "delta_vs_baseline_high": None if p.vs_baseline is None else round(p.vs_baseline.high, 2),
                "delta_vs_tuned": None if p.vs_tuned is None else round(p.vs_tuned.value, 2),
                "delta_vs_tuned_low": None if p.vs_tuned is None else round(p.vs_tuned.low, 2),
                "delta_vs_tuned_high": None if p.vs_tuned is None else round(p.vs_tuned.high, 2),
                "flop_speedup": round(p.flop_speedup, 3),
                "ttft_speedup": round(p.ttft_speedup, 3),
            }
        )
    return out


def markdown(report: MatchedReport, header: str) -> str:
    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    lines = [
        header,
        "",
        f"**Matched speed**: every peer's size knob set to the tuned schedule's FLOP-model speedup "
        f"{report.target_flop_speedup:.2f}x (n = {report.n} examples; unpruned score "
        f"{report.baseline_score:.2f}; intervals: paired bootstrap, 95%)",
        "",
        "| method | knobs | n | score | vs unpruned | vs tuned | FLOP speedup | measured TTFT speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in report.points:
        if p.role not in ("tuned", "matched"):
            continue
        knobs = ", ".join(f"{k}={v:g}" for k, v in sorted(p.options.items())) or "-"
        lines.append(
            f"| {p.label if p.role == 'matched' else 'tuned schedule (lazyllm)'} | {knobs} | {p.n} | "
            f"{p.score:.2f} | {p.vs_baseline} | {p.vs_tuned or '-'} | {p.flop_speedup:.2f}x | "
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
        "| point | n | score | vs unpruned | vs tuned | FLOP | TTFT |",
    ]
    lines.append("|---|---|---|---|---|---|---|")
    for p in report.points:
        lines.append(
            f"| {p.label} | {p.n} | {p.score:.2f} | {p.vs_baseline} | {p.vs_tuned or '-'} | "
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
        ax.set_xlabel(f"{name} speedup (x, median over examples)")
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
    known: Mapping[str, Sequence[ExampleResult]] | None = None,
) -> str:
    """The ``--match-speedup`` part of ``python -m tuner.evaluate``: compare, write, return the markdown.

    Peers come from ``--methods`` (:data:`DEFAULT_PEERS` if it names none); their
    ``--method-options`` other than the size knob stay fixed. ``known``: results the caller already has
    for a method at its default knobs on the same examples (e.g. ``lazyllm``), used instead of rerunning.
    """
    known = known or {}
    model, tokenizer = evaluator.model, evaluator.tokenizer
    out = settings.out_dir

    def runner(method: str, options: Mapping[str, float]) -> list[ExampleResult]:
        if not options and method in known:
            return list(known[method])
        generator = make_method(method, model, tokenizer, schedule, seed=settings.seed, options=options)
        results, _ = evaluator.evaluate(label_of(method, options), generator)
        return results

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
        ModelDims.from_config(model.config),
        [len(ex.input_ids) for ex in evaluator.examples],
        peers=peers,
        fixed=settings.options_by_method,
    )
    header = (
        f"model {settings.model}, task {settings.task} ({settings.language}), split {settings.split}, "
        f"prompts cut to {settings.max_prompt_tokens} tokens, schedule {settings.schedule}"
    )
    return write(report, out, header, f"{settings.model_slug} {settings.task} {settings.split}")
