"""How often does the study's decision rule break the budget, and how much speed does it leave behind?

    python benchmarks/decision_rule.py [--rows benchmarks/data/objective_noise_512.rows.jsonl]
        [--sizes 13,50,100,200] [--resamples 500] [--budget 2[,3]] [--prior PRIOR.json] [--out results.json]
    python benchmarks/decision_rule.py --rows benchmarks/data/grid-smollm2-135m-openqa-validation-1024.jsonl \
        --test-rows benchmarks/data/grid-smollm2-135m-openqa-test-1024.jsonl --sizes 13,50,100,200

Replays the product's own rule (:func:`tuner.stages.rule.pooled_rule`, the function the study calls)
as a classifier, on a grid of schedules whose validation *and* test evidence was recorded per example
(teacher-forced KL and task-score loss; ``benchmarks/objective_noise.py`` writes such rows). Each
replay draws a validation set of ``n`` examples from the grid's validation pool (with replacement,
within datasets, in proportion to them), builds each schedule's trial record from that draw (mean
KL with its one-sided 90% bound, as a study's trial would have it), lets the rule pick, and scores the
pick on the full test split:

* (a) **over budget**: how often the pick's test task loss (point estimate, score points) exceeds the
  budget;
* (b) **speed kept**: the pick's FLOP speedup over the fastest grid schedule whose test loss is within
  the budget (a replay that recommends nothing keeps 1.0x, the unpruned model's);
* (b) of the **pool oracle**: the same ratio for the fastest schedule whose loss on the *whole*
  validation pool is within the budget, what a rule that knew the pool exactly would keep. Where
  validation and test disagree on which schedules keep the budget, (b) = 1 asks a rule to pick a
  schedule that validation says breaks it; the oracle says what reading validation well is worth;
* the **winner's curse**, where the rows hold test KLs: the median of the pick's test KL over its KL
  on the draw that chose it (above 1: the draw flattered it).

One row per (rule setting, n): the default study's settings (``--confirm-k``, ``--decision-level``,
the exploration cap ``KL_PER_POINT``) and a few around them. A draw larger than the pool repeats its
examples, so it says how the rule behaves on more data only as far as the pool is representative:
the table marks such rows. ``--prior`` replays the rule with a slope prior's floor
(:mod:`tuner.statistics.prior`); a prior fitted on the same validation pool makes that replay
optimistic; such a prior scales by the unpruned score, read as a study reads it (the deciding bound at
the draw's score's one-sided bound at the confidence level), and ``--score-levels`` adds rows reading it
at the score itself, at another level's bound, or with the score taken as exact (the rule before
ff95ee0). ``--exponent`` replays the rule with a concave calibration (``loss = slope x KL^p``,
``--calibration-exponent`` of a study; its ``--prior`` must be fitted at the same ``p``). ``--out`` also writes the default rule's rows as the **power curve**
(``benchmarks/slope_prior.py --power`` stores it in the prior). The measured tables, dated, are in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lazyllm.schedule import Revival, Schedule
from lazyllm.scoring import Scoring
from tuner.data.longbench import unit_hash
from tuner.evaluation.losses import FidelityLoss, ScoreLoss
from tuner.report.figure import pyplot, write_figure
from tuner.stages.rule import FreshKL, Refused, measured_fresh_kl, pooled_rule
from tuner.statistics.bootstrap import Estimate, check_level, estimate, macro_weights, weighted_mean
from tuner.statistics.calibration import ScoredSchedule, UnprunedScore
from tuner.statistics.cap import KL_PER_POINT
from tuner.statistics.prior import SlopePrior
from tuner.statistics.shape import check_exponent
from tuner.study.records import TrialRecord
from tuner.study.settings import SearchSettings

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DECISION_LEVEL: float = SearchSettings.decision_level
CONFIRM_K: int = SearchSettings.confirm_k
CONFIDENCE: float = SearchSettings.confidence
SCORE_LEVEL: float | None = CONFIDENCE if SearchSettings.prior_at_score_bound else None
EXPONENT: float = SearchSettings.calibration_exponent
N_BOOT = 300  # per replay: the rule's bootstraps (front bound and calibration), cheaper than a study's


@dataclass(frozen=True)
class GridSchedule:
    """One grid schedule's recorded evidence: per example key, KL (nats) and task loss (points)."""

    name: str
    schedule: Schedule
    flop_speedup: float
    validation: Mapping[str, tuple[float, float]]  # key -> (kl, task loss)
    datasets: Mapping[str, str]  # key -> dataset
    test_loss: float  # macro mean task loss on test, points
    baselines: Mapping[str, float] = field(default_factory=dict)  # validation key -> unpruned score, points
    test_kl: float | None = None  # macro mean KL on test, nats (None: the rows have no test KL)
    test_interval: tuple[float, float] | None = None  # 90% interval of test_loss (None: not recorded)
    control: bool = False  # the recorder's keep-all control (its loss is noise): shown, never replayed


@dataclass(frozen=True)
class RuleSetting:
    """The rule's knobs that a study's settings set."""

    k: int = CONFIRM_K
    level: float = DECISION_LEVEL
    kl_per_point: float = KL_PER_POINT
    exponent: float = EXPONENT
    # a scaled prior's deciding bound read at the draw's unpruned score's one-sided bound at this level
    # (None: at the score, the rule before 2026-12-07); at CONFIDENCE it is the study's own path
    score_level: float | None = SCORE_LEVEL
    exact_score: bool = False  # the score taken as exact, its bound read nowhere (the rule before ff95ee0)

    @property
    def default(self) -> bool:
        """The study's default knobs at this calibration exponent (the power curve's rows)."""
        return (self.k, self.level, self.kl_per_point, self.score_level) == (
            CONFIRM_K, DECISION_LEVEL, KL_PER_POINT, SCORE_LEVEL,
        ) and not self.exact_score  # fmt: skip

    @property
    def label(self) -> str:
        shape = "" if self.exponent == EXPONENT else f", loss ~ KL^{self.exponent:g}"
        if self.exact_score:
            shape += ", the score taken as exact"
        elif self.score_level != SCORE_LEVEL:
            at = "the score" if self.score_level is None else f"the score's {self.score_level:g} bound"
            shape += f", prior decides at {at}"
        return f"pooled, k {self.k}, cap {self.kl_per_point:g} nats/point, level {self.level:g}{shape}" + (
            " (default)" if self.default else ""
        )


SETTINGS: tuple[RuleSetting, ...] = (
    RuleSetting(),
    RuleSetting(k=3),
    RuleSetting(level=0.8),
    RuleSetting(level=0.9),
    RuleSetting(k=8),
)


def load_grid(path: Path) -> list[GridSchedule]:
    """The schedules of a rows file (one JSON object per schedule, with its ``examples``)."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        scoring = Scoring.parse(row["scoring"]) if row.get("scoring") else Scoring()
        sched = Schedule(
            model="grid",
            percentiles=tuple(float(p) for p in row["percentiles"]),
            revival=Revival.parse(str(row.get("revival", "dynamic"))),
            scoring=scoring,
        )
        val = {
            e["key"]: (float(e["kl"]), float(e["score"]))
            for e in row["examples"]
            if e["split"] == "validation"
        }
        test = [e for e in row["examples"] if e["split"] == "test"]
        est = estimate([e["score"] for e in test], macro_weights([e["dataset"] for e in test]))
        datasets = {e["key"]: e["dataset"] for e in row["examples"]}
        out.append(
            GridSchedule(
                row["schedule"], sched, float(row["flop_speedup"]), val, datasets, est.value,
                test_interval=(est.low, est.high),
            )
        )  # fmt: skip
    if not out:
        raise ValueError(f"{path}: no schedules")
    return out


HOLDOUT_SEED = 7919
"""Seed of the one-split holdout hash: not the split's own seed, whose hash put every validation
example below the validation share."""


def held_out(key: str, share: float) -> bool:
    """Whether example ``key`` is in the held-out ``share`` of a one-split pool (a hash of the key)."""
    return unit_hash(HOLDOUT_SEED, key) < share


def load_example_rows(validation: Path, test: Path | None, holdout: float = 0.5) -> list[GridSchedule]:
    """The schedules of ``benchmarks/record_grid.py``'s per-example rows (one file per split, each with
    its ``<file>.schedules.json``): LazyLLM schedules with a KL only (a peer method has none, so a
    fidelity study could not rank it), on the examples every such schedule has in both files (a grid
    still being recorded is replayed on what it holds: its schedules recorded on at least half as many
    examples as the fullest). Without ``test`` the validation rows are split in two by a hash of the
    example key, ``holdout`` of them standing in for test (the two splits are hashed alike from one
    distribution, so this previews the power curve before the test split is recorded)."""
    schedules = json.loads(validation.with_suffix(".schedules.json").read_text())
    rows: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}  # split -> schedule -> example -> row
    sources = (("validation", validation),) if test is None else (("validation", validation), ("test", test))
    for split, path in sources:
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if r.get("kl_nats_per_token") is not None:
                    part = "test" if test is None and held_out(r["example"], holdout) else split
                    rows.setdefault(part, {}).setdefault(r["schedule"], {})[r["example"]] = r
    names = [
        n for n, s in schedules.items() if s.get("schedule") and all(n in rows.get(sp, {}) for sp in rows)
    ]
    if names:
        most = max(len(rows["validation"].get(n, {})) for n in names)
        names = [n for n in names if 2 * len(rows["validation"].get(n, {})) >= most]
    seen: dict[str, str] = {}  # an older grid may hold one schedule under two names: the fuller stays
    for n in sorted(names, key=lambda n: -len(rows["validation"].get(n, {}))):
        seen.setdefault(json.dumps(schedules[n]["schedule"], sort_keys=True), n)
    names = [n for n in names if n in seen.values()]
    if len(rows) < 2 or not names:
        raise ValueError(f"{validation} and {test}: no LazyLLM schedule recorded on both splits")
    controls = {n for n in names if schedules[n].get("family") == "control"}  # benchmarks/record_grid.py's
    candidates = [n for n in names if n not in controls] or names
    shared = {sp: set.intersection(*(set(rows[sp][n]) for n in candidates)) for sp in rows}
    out = []
    for name in names:  # on the examples every candidate holds (a control recorded on fewer: on its own)
        keys = {sp: shared[sp] & set(rows[sp][name]) for sp in rows}
        val = {k: rows["validation"][name][k] for k in sorted(keys["validation"])}
        tst = [rows["test"][name][k] for k in sorted(keys["test"])]
        if not val or not tst:
            raise ValueError(f"{validation} and {test}: the schedules share no example of one split")
        test_est = estimate(
            [100.0 * (r["baseline_score"] - r["score"]) for r in tst],
            macro_weights([r["dataset"] for r in tst]),
            strata=[r["dataset"] for r in tst],
        )
        datasets = {k: r["dataset"] for k, r in val.items()} | {
            f"test:{r['example']}": r["dataset"] for r in tst
        }
        out.append(
            GridSchedule(
                name, Schedule.from_json(schedules[name]["schedule"]), float(next(iter(val.values()))["flop_speedup"]),
                {k: (float(r["kl_nats_per_token"]), 100.0 * (r["baseline_score"] - r["score"])) for k, r in val.items()},
                datasets, test_est.value, {k: 100.0 * r["baseline_score"] for k, r in val.items()},
                weighted_mean([float(r["kl_nats_per_token"]) for r in tst], macro_weights([r["dataset"] for r in tst])),
                (test_est.low, test_est.high), name in controls,
            )
        )  # fmt: skip
    return out


def draw_keys(
    pool: Sequence[str], datasets: Mapping[str, str], n: int, rng: np.random.Generator
) -> list[str]:
    """``n`` validation keys drawn with replacement, each dataset in proportion to its share of ``pool``."""
    by: dict[str, list[str]] = {}
    for k in pool:
        by.setdefault(datasets[k], []).append(k)
    sizes = {d: max(1, round(n * len(ks) / len(pool))) for d, ks in by.items()}
    return [str(k) for d, ks in sorted(by.items()) for k in rng.choice(ks, size=sizes[d], replace=True)]


def records_of(
    grid: Sequence[GridSchedule], keys: Sequence[str]
) -> tuple[list[TrialRecord], dict[str, float]]:
    """Each schedule's trial record on the drawn ``keys`` (each draw its own example, so a repeated key
    counts twice, as a study on that draw would see it), and the draw's macro weights."""
    draws = [f"{key}#{i}" for i, key in enumerate(keys)]
    w = macro_weights([grid[0].datasets[k] for k in keys])
    weights = dict(zip(draws, w))
    records = []
    for i, g in enumerate(grid):
        kl = [g.validation[k][0] for k in keys]
        records.append(
            TrialRecord(
                number=i, schedule=g.schedule, params={}, accuracy="fidelity",
                flop_speedup=g.flop_speedup, prompt_computed_pct=0.0, examples_run=len(keys),
                loss=estimate(kl, w, level=CONFIDENCE, n_boot=N_BOOT), speedup=g.flop_speedup,
                per_example=dict(zip(draws, kl)),
            )
        )  # fmt: skip
    return records, weights


def replay(
    grid: Sequence[GridSchedule], budget: float, sizes: Iterable[int], resamples: int,
    settings: Sequence[RuleSetting] = SETTINGS, prior: SlopePrior | None = None, fresh: int = 0,
) -> list[dict[str, Any]]:  # fmt: skip
    """One result row per (setting, n): over-budget rate, speed kept, no-pick rate, most common pick.

    ``fresh`` > 0: the rule's fresh-drift check (step 5 of :func:`pooled_rule`) reads a schedule's
    mean KL on ``fresh`` pool examples drawn outside the validation draw, as a study reads open-QA
    prompts its search never saw."""
    pool = sorted(grid[0].validation)
    best_ok = max((g.flop_speedup for g in grid if g.test_loss <= budget), default=1.0)
    pool_best = best_on_pool(grid, budget)
    task = ScoreLoss(budget)
    out = []
    for n in sizes:
        for setting in settings:
            rng = np.random.default_rng(n)  # every setting of one n sees the same draws
            cap = FidelityLoss(setting.kl_per_point * budget)
            over, kept, none, picks, optimism = 0, [], 0, [], []
            for i in range(resamples):
                keys = draw_keys(pool, grid[0].datasets, n, rng)
                records, weights = records_of(grid, keys)
                index = {f"{key}#{j}": key for j, key in enumerate(keys)}

                def evidence(
                    rs: Sequence[TrialRecord], index: Mapping[str, str] = index
                ) -> list[ScoredSchedule]:  # the recorded task loss of each drawn example
                    return [
                        ScoredSchedule(
                            r.number,
                            r.per_example,
                            {d: grid[r.number].validation[k][1] for d, k in index.items()},
                        )
                        for r in rs
                    ]

                seen = None
                if fresh:
                    rest = [k for k in pool if k not in set(keys)]
                    others = draw_keys(rest, grid[0].datasets, fresh, rng)
                    w_rest = macro_weights([grid[0].datasets[k] for k in others])

                    def seen(
                        r: TrialRecord, refused: Refused, others: Sequence[str] = others, w: Any = w_rest
                    ) -> FreshKL:  # recorded KLs cost nothing: every prompt, no early stop
                        kls = [grid[r.number].validation[k][0] for k in others]
                        return measured_fresh_kl(
                            kls, list(w), [grid[0].datasets[k] for k in others], CONFIDENCE
                        )

                baseline: float | UnprunedScore | None = None
                if grid[0].baselines:  # the draw's unpruned score, what a scaled prior is read at
                    scores, w = [grid[0].baselines[k] for k in keys], list(weights.values())
                    if setting.exact_score:
                        baseline = weighted_mean(scores, w)
                    elif setting.score_level in (None, CONFIDENCE):  # the study's path: with its bound
                        baseline = UnprunedScore.measured(scores, w, level=CONFIDENCE, n_boot=N_BOOT, seed=i)
                    else:  # another level: that bound, taken as exact
                        baseline = UnprunedScore.measured(
                            scores, w, level=setting.score_level, n_boot=N_BOOT, seed=i
                        ).upper  # fmt: skip
                decision = pooled_rule(
                    records, cap, task, setting.k, weights, evidence, level=setting.level,
                    confidence=CONFIDENCE, prior=prior, baseline_score=baseline,
                    decide_at_bound=setting.score_level == CONFIDENCE, fresh=seen, n_boot=N_BOOT,
                    seed=i, exponent=setting.exponent,
                )  # fmt: skip
                pick = decision.picked
                if pick is None:
                    none += 1
                    kept.append(1.0 / best_ok)
                    continue
                g = grid[pick.number]
                picks.append(g.name)
                over += g.test_loss > budget
                kept.append(g.flop_speedup / best_ok)
                if g.test_kl is not None and pick.values[1] > 0:  # the pick's KL on test over on its draw
                    optimism.append(g.test_kl / pick.values[1])
            out.append({
                "rule": setting.label + ("" if prior is None else f", floored at {prior.id}")
                + (f", fresh KL on {fresh}" if fresh else ""),
                "default": setting.default, "exponent": setting.exponent, "budget": budget, "n": n, "pool": len(pool), "resamples": resamples,
                "over_budget": over / resamples, "speed_kept": statistics.fmean(kept),
                "no_pick": none / resamples,
                "most_common_pick": max(set(picks), key=picks.count) if picks else "-",
                "best_within_budget_on_test": best_ok,
                "best_within_budget_on_pool": pool_best,
                "speed_kept_by_pool_oracle": pool_best / best_ok,
                # the winner's curse: how much more the pick drifts on test than on the draw that chose it
                "pick_kl_test_over_draw": statistics.median(optimism) if optimism else None,
            })  # fmt: skip
    return out


def best_on_pool(grid: Sequence[GridSchedule], budget: float) -> float:
    """The FLOP speedup of the fastest schedule whose macro task loss on the whole validation pool is
    within ``budget`` (1.0: none is): the pick of a rule that knew the pool's means exactly."""
    pool = sorted(grid[0].validation)
    weights = list(macro_weights([grid[0].datasets[k] for k in pool]))
    return max(
        (
            g.flop_speedup
            for g in grid
            if weighted_mean([g.validation[k][1] for k in pool], weights) <= budget
        ),
        default=1.0,
    )


def table(results: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| n | rule | (a) test loss over budget | (b) speed kept | (b) pool oracle | no pick | pick's KL, test / draw (median) | most common pick |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        n = f"{r['n']}" + (f" (pool {r['pool']}: repeats)" if r["n"] > r["pool"] else "")
        ratio = "-" if r.get("pick_kl_test_over_draw") is None else f"{r['pick_kl_test_over_draw']:.2f}"
        lines.append(
            f"| {n} | {r['rule']} | {r['over_budget']:.1%} | {r['speed_kept']:.2f} | {r['speed_kept_by_pool_oracle']:.2f} | {r['no_pick']:.1%} | {ratio} | {r['most_common_pick']} |"
        )
    return "\n".join(lines)


def validation_columns(g: GridSchedule) -> tuple[list[float], list[float], list[str], list[float]]:
    """``g``'s validation examples as columns: KL, task loss, dataset and macro weight per example."""
    keys = sorted(g.validation)
    groups = [g.datasets[k] for k in keys]
    return (
        [g.validation[k][0] for k in keys],
        [g.validation[k][1] for k in keys],
        groups,
        macro_weights(groups),
    )


def validation_loss(g: GridSchedule) -> tuple[float, Estimate]:
    """``g``'s mean KL (nats) and task loss (points, 90% interval over examples, macro over datasets)
    on the whole validation pool."""
    kls, losses, groups, weights = validation_columns(g)
    return weighted_mean(kls, weights), estimate(losses, weights, strata=groups)


def schedule_table(grid: Sequence[GridSchedule]) -> str:
    """The grid's schedules, slowest first: FLOP speedup, and on each split the mean KL and the task
    loss (validation: the whole pool; 90% intervals over examples, macro over datasets)."""
    lines = [
        "| schedule | FLOP speedup | validation KL (nats) | validation task loss [90%] | test KL (nats) | test task loss [90%] |",
        "|---|---|---|---|---|---|",
    ]
    for g in sorted(grid, key=lambda g: g.flop_speedup):
        kl, loss = validation_loss(g)
        test_kl = "-" if g.test_kl is None else f"{g.test_kl:.3f}"
        test = f"{g.test_loss:.2f}" + (
            "" if g.test_interval is None else " [{:.2f}, {:.2f}]".format(*g.test_interval)
        )
        lines.append(
            f"| {g.name} | {g.flop_speedup:.2f}x | {kl:.3f} | {loss.value:.2f} [{loss.low:.2f}, {loss.high:.2f}] "
            f"| {test_kl} | {test} |"
        )
    return "\n".join(lines)


def grid_figure(grid: Sequence[GridSchedule], budgets: Sequence[float], title: str) -> Figure:
    """Task loss against FLOP speedup for every schedule of ``grid``, on each split with its 90%
    interval and its example count, the ``budgets`` drawn across (what ``--schedules`` tabulates)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.0, 4.8))
    ordered = sorted(grid, key=lambda g: g.flop_speedup)
    speeds = np.array([g.flop_speedup for g in ordered])
    pool, n_test = split_sizes(grid)
    val = [validation_loss(g)[1] for g in ordered]
    ax.errorbar(
        speeds * 0.99,
        [e.value for e in val],
        yerr=[[e.value - e.low for e in val], [e.high - e.value for e in val]],
        fmt="o",
        capsize=3,
        label=f"validation (n={pool})",
    )
    test = [g.test_loss for g in ordered]
    spans = [g.test_interval or (g.test_loss, g.test_loss) for g in ordered]
    ax.errorbar(
        speeds * 1.01,
        test,
        yerr=[[t - lo for t, (lo, _) in zip(test, spans)], [hi - t for t, (_, hi) in zip(test, spans)]],
        fmt="s",
        capsize=3,
        label=f"test (n={n_test})",
    )
    for b in budgets:
        ax.axhline(b, linestyle="--", color="grey", linewidth=1)
        ax.annotate(f"budget {b:g}", (speeds.max(), b), textcoords="offset points", xytext=(0, 3), ha="right")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xscale("log")
    ticks = [
        t
        for t in (1.0, 1.1, 1.2, 1.4, 1.6, 2.0, 2.5, 3.0, 4.0, 6.0)
        if speeds.min() * 0.9 <= t <= speeds.max() * 1.1
    ]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xlabel("FLOP speedup of TTFT (log scale)")
    ax.set_ylabel("task loss, score points (unpruned - pruned)")
    ax.set_title(f"{title}: {len(grid)} schedules, 90% intervals", fontsize=10)
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def split_sizes(grid: Sequence[GridSchedule]) -> tuple[int, int]:
    """The grid's validation pool and test split sizes (every schedule holds the same examples)."""
    pool = len(grid[0].validation)
    return pool, len(grid[0].datasets) - pool


SHAPES = (1.0, 0.75, 0.5)
"""Exponents ``p`` of the cost curves :func:`shape_table` compares: task loss = slope * KL^p."""
SMALL_KL = 0.1
"""The region :func:`shape_table` also judges alone: schedules drifting at most this many nats on the
judged split, where a 2-point budget's picks sit (docs/statistics.md#small-drifts-cost-more-both-presets-on-the-square-root)."""


def shape_table(grid: Sequence[GridSchedule]) -> str:
    """How task loss grows with KL across the grid's schedules: for each exponent of :data:`SHAPES`,
    the slope of loss = slope * KL^p through the origin (least squares over the schedules' means),
    fitted on one split and judged on the other: the mean residual (the splits' offset) and their
    spread around it (how well the shape ranks the schedules; a study fits ``p = 0.5`` unless told), and the
    mean residual of the schedules drifting at most :data:`SMALL_KL` nats there (positive: the shape
    predicts less loss than they lose)."""
    means = {}
    for g in grid:
        if g.test_kl is None:
            continue
        kls, losses, _, weights = validation_columns(g)
        means[g.name] = (
            (weighted_mean(kls, weights), weighted_mean(losses, weights)),
            (g.test_kl, g.test_loss),
        )
    if not means:  # whole-schedule rows (objective_noise.py) score test without KL
        return "no shape table: the rows hold no test KL (per-example rows of benchmarks/record_grid.py do)"
    lines = [
        "| shape | fitted on | slope | residual mean on the other split | residual spread (sd) "
        f"| residual mean at KL <= {SMALL_KL:g} (schedules) |",
        "|---|---|---|---|---|---|",
    ]
    for p in SHAPES:
        for fit, judge, label in ((0, 1, "validation"), (1, 0, "test")):
            xs = [means[n][fit][0] ** p for n in means]
            slope = sum(x * means[n][fit][1] for x, n in zip(xs, means)) / max(sum(x * x for x in xs), 1e-12)
            res = [means[n][judge][1] - slope * means[n][judge][0] ** p for n in means]
            bias = sum(res) / len(res)
            sd = (sum((r - bias) ** 2 for r in res) / len(res)) ** 0.5
            small = [r for r, n in zip(res, means) if means[n][judge][0] <= SMALL_KL]
            at_small = f"{sum(small) / len(small):+.2f} ({len(small)})" if small else "none"
            lines.append(f"| KL^{p:g} | {label} | {slope:.2f} | {bias:+.2f} | {sd:.2f} | {at_small} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--rows",
        default=str(Path(__file__).parent / "data" / "objective_noise_512.rows.jsonl"),
        help="per-schedule rows with validation and test examples (default: the committed 20-schedule grid)",
    )
    p.add_argument(
        "--test-rows",
        default=None,
        help="with per-example rows of benchmarks/record_grid.py: --rows is the validation file, this the test one",
    )
    p.add_argument(
        "--holdout",
        type=float,
        default=0.5,
        help="with per-example --rows and no --test-rows: this share of the validation examples stands in for test",
    )
    p.add_argument("--budget", default="2", help="task-score points (comma-separated: one table each)")
    p.add_argument("--sizes", default=None, help="validation sizes n to draw (default: the pool's size)")
    p.add_argument("--resamples", type=int, default=500)
    p.add_argument("--out", default=None, help="also write the results as JSON here (dated)")
    p.add_argument(
        "--prior",
        default=None,
        help="a slope prior JSON: replay the rule with its floor (default: the study's own calibration alone)",
    )
    p.add_argument("--settings", choices=("all", "default"), default="all", help="rule settings replayed")
    p.add_argument(
        "--schedules",
        action="store_true",
        help="first print the grid's schedules (speed, KL and task loss per split) and the shape of loss in KL",
    )
    p.add_argument(
        "--plot",
        default=None,
        help="also draw the grid's schedules (task loss against speed, each split with its n) as a PNG here",
    )
    p.add_argument(
        "--confirm-k",
        type=int,
        default=None,
        help="replay only the default rule with this many scored schedules (a preset's confirm_k)",
    )
    p.add_argument(
        "--fresh",
        type=int,
        default=0,
        help="the fresh-drift check on this many pool examples outside each draw (0: off)",
    )
    p.add_argument(
        "--exponent",
        type=float,
        default=EXPONENT,
        help="the calibration's shape p, task loss = slope x KL^p (a study's --calibration-exponent)",
    )
    p.add_argument(
        "--decision-level",
        type=float,
        default=None,
        help=f"with --confirm-k: the level of the predicted-loss bound that picks (a study's --decision-level; "
        f"default {DECISION_LEVEL:g})",
    )
    p.add_argument(
        "--score-levels",
        default=None,
        help="with --confirm-k and --prior: also replay the rule with a scaled prior's deciding bound read at "
        "the draw's unpruned score's one-sided bound at each of these levels, or at the score itself "
        "(comma-separated, e.g. none,0.6,0.75; the study's default reads it at --confidence's); exact: the "
        "score taken as exact for every bound (the rule before ff95ee0)",
    )
    args = p.parse_args(argv)
    budgets = [float(b) for b in args.budget.split(",")]
    try:
        exponent = check_exponent(args.exponent)
        prior = None if args.prior is None else SlopePrior.load(args.prior)
        if prior is not None and prior.exponent != exponent:
            raise ValueError(
                f"--prior {args.prior} was fitted at exponent {prior.exponent:g}, --exponent is {exponent:g}: "
                "give a prior fitted at the same exponent (benchmarks/slope_prior.py --exponent)"
            )
    except ValueError as e:
        p.error(str(e))
    per_example = Path(args.rows).with_suffix(".schedules.json").exists()
    grid = (
        load_example_rows(Path(args.rows), Path(args.test_rows) if args.test_rows else None, args.holdout)
        if per_example
        else load_grid(Path(args.rows))
    )
    controls, grid = [g for g in grid if g.control], [g for g in grid if not g.control]
    if not grid:
        p.error(f"{args.rows}: no schedule but the keep-all control")
    pool, n_test = split_sizes(grid)
    sizes = [pool] if args.sizes is None else [int(s) for s in args.sizes.split(",")]
    print(f"{len(grid)} schedules, {pool} validation / {n_test} test examples")
    if args.schedules:
        print(schedule_table(controls + grid))
        print(shape_table(grid))
    if args.plot:
        title = f"{Path(args.rows).stem}"
        print(f"written: {write_figure(grid_figure(grid, budgets, title), Path(args.plot))}")
    settings = SETTINGS if args.settings == "all" else (RuleSetting(),)
    if args.confirm_k is not None:
        settings = (RuleSetting(k=args.confirm_k, level=args.decision_level or DECISION_LEVEL),)
        for lv in [] if args.score_levels is None else args.score_levels.split(","):
            if lv.strip().lower() == "exact":
                settings += (replace(settings[0], score_level=None, exact_score=True),)
                continue
            try:
                level = None if lv.strip().lower() == "none" else float(lv)
                if level is not None:
                    check_level(level)
            except ValueError as e:
                p.error(f"--score-levels {args.score_levels}: {e} (levels in [0.5, 1), or none)")
            settings += (replace(settings[0], score_level=level),)
    elif args.decision_level is not None or args.score_levels is not None:
        p.error("--decision-level and --score-levels replay one rule: give --confirm-k too")
    if args.score_levels is not None and prior is None:
        p.error("--score-levels reads a slope prior's scale: give --prior too")
    settings = tuple(replace(s, exponent=exponent) for s in settings)
    results = []
    for budget in budgets:
        part = replay(grid, budget, sizes, args.resamples, settings, prior, args.fresh)
        print(f"budget {budget:g} score points\n{table(part)}")
        print(
            f"fastest schedule within budget on test: {part[0]['best_within_budget_on_test']:.2f}x FLOP speedup;"
            f" on the whole validation pool: {part[0]['best_within_budget_on_pool']:.2f}x"
            f" ((b) of that pool oracle: {part[0]['speed_kept_by_pool_oracle']:.2f})"
        )
        results += part
    if args.out:
        payload = {
            "date": date.today().isoformat(),
            "rows": args.rows,
            "test_rows": args.test_rows,
            "prior": None if prior is None else prior.id,
            "fresh": args.fresh,
            "exponent": exponent,
            "budgets": budgets,
            "results": results,
            # the power curve: the default rule's rows, as benchmarks/slope_prior.py --power reads them
            "power": [
                {"budget": r["budget"], "n": r["n"], "exceed_rate": r["over_budget"],
                 "speed_ratio": r["speed_kept"], "replays": r["resamples"]}
                for r in results if r["default"]
            ],
        }  # fmt: skip
        Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
