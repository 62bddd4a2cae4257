"""How often does a recommendation rule break the budget, and how much speed does it leave behind?

    python benchmarks/decision_rule.py [--rows benchmarks/data/objective_noise_512.rows.jsonl] [--resamples 500]

Replays the rule that turns a study's evidence into ``recommended.json`` as a classifier, on a grid of
schedules whose validation *and* test evidence ``benchmarks/objective_noise.py`` recorded (per example:
teacher-forced KL and task-score loss). Each replay resamples the validation examples (bootstrap,
within datasets) as if a study had seen another draw of them, lets the rule pick from the grid's
validation Pareto front (FLOP speedup up, mean KL down), and scores the pick on the full test split:

* (a) **error rate**: how often the pick's test task loss (point estimate, score points) exceeds the
  budget;
* (b) **speed kept**: the pick's FLOP speedup over the fastest grid schedule whose test loss is within
  the budget (a replay that recommends nothing keeps 1.0x, the unpruned model's).

Rules:

* ``direct`` (before the pooled calibration): a KL cap of 0.05 nats, then the 3 fastest front
  schedules raced on their own task-score bound (one-sided 90%) against the budget;
* ``pooled`` (tuner.stages.confirm.confirm_pooled): the exploration cap (``KL_PER_POINT`` nats per
  point of budget, on the KL's one-sided 90% bound), ``k`` front schedules spread over the feasible
  front task-scored, the pooled calibration, the fastest front schedule whose predicted task-loss
  bound (at the decision level) is within budget and within the largest scored KL; shown with the
  settings of earlier rounds, with the default (``--confirm-k``, ``--decision-level``), and around it.

Measured 2026-12-01 (500 replays at budget 2; one run per grid, so every row of a grid saw the same
resamples in the same order):

``benchmarks/data/objective_noise_512.rows.jsonl``, the rows of ``benchmarks/objective_noise.py
--max-prompt-tokens 512 --no-gold``: 20 schedules, SmolLM2, 512-token QA prompts, frozen revival,
13 validation / 29 test examples; the fastest schedule within budget on test runs 1.72x (FLOP):

| rule | (a) over budget on test | (b) speed kept |
|---|---|---|
| direct (before the calibration) | 0.0% | 0.74 |
| pooled, k 3, cap 0.15, level 0.9 (three rounds ago) | 0.0% | 0.77 |
| pooled, k 3, cap 0.3, level 0.6 (last round) | 0.0% | 0.90 |
| **pooled, k 6, cap 0.3, level 0.6 (default)** | **0.0%** | **0.93** |
| pooled, k 6, level 0.7 / 0.8 / 0.9 | 0.0% / 0.0% / 0.0% | 0.91 / 0.86 / 0.81 |
| pooled, k 8, level 0.6 | 0.0% | 0.93 |

``benchmarks/data/objective_noise_1024_rules.rows.jsonl``, ``objective_noise.py --grid rules
--max-prompt-tokens 1024 --no-gold --test-score-only``: 15 schedules at the default study's 1024
tokens, today's rule and FastKV's, the last one a default study's recommendation; the fastest within
budget on test runs 1.57x:

| rule | (a) | (b) |
|---|---|---|
| direct | 14.6% (37.8% no pick) | 0.74 |
| pooled, k 3, cap 0.15, level 0.9 | 77.6% | 1.00 |
| pooled, k 3, cap 0.3, level 0.6 (last round) | 92.2% | 1.17 |
| **pooled, k 6, cap 0.3, level 0.6 (default)** | **54.4%** | **1.04** |
| pooled, k 6, level 0.7 / 0.8 / 0.9 | 42.8% / 29.8% / 64.4% | 1.00 / 0.97 / 0.95 |
| pooled, k 8, level 0.6 | 55.8% | 1.04 |

Scoring 6 schedules instead of 3 helps on both grids: with 3 the slope rests on one or two drifting
schedules (the spread also takes the slowest front schedule, which barely drifts) and follows their
luck on 13 examples. On the 1024 grid no rule meets (a): most schedules at 1.3x or more lose 2-4
points on test with +-2-point intervals (n=29), and validation KL and task score on 13 examples do not
rank them by test loss (FastKV 30% after each quarter: KL 0.046, test loss 3.00; TSP keeping 40%: KL
0.042, test loss 1.31). Level 0.8 comes closest (29.8%), but in the default study (seed 0) it fell
back to the paper-style warm start, 1.29x TTFT on test with loss 2.22 [0.31, 4.85] (n=29), where 0.6
picks TSP keeping 40%, 1.45x with 1.31 [-1.02, 3.62]: two scored schedules of almost no drift (KL 0.007
and 0.024) lost about 2 points each on one or two flipped answers, and at 0.8 the slope's bound was
66 points per nat against 43 at 0.6. The rows and their 13 validation examples are what limits the
rule, not its level: more validation examples than the QA split holds would.

Before (2026-11-30, budgets 1 and 3, 300 replays, k 3): at a 1-point budget both pooled rules broke
it in about a quarter of the replays (the picks are 1.3-1.4x schedules whose test loss, 1.2-1.8
points on 29 examples, is itself uncertain by +-2 points); the direct rule never did because it
almost always picked paper-style. At budget 3 on the 1024 grid, level 0.6 broke it in 42.3% and level
0.9 in 11.0%. "Speed kept" above 1 means a pick faster than the fastest schedule within budget on
test (a pick over budget).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tuner.stages.confirm import spread
from tuner.statistics.bootstrap import estimate, macro_weights
from tuner.statistics.calibration import ScoredSchedule, fit
from tuner.statistics.losses import KL_PER_POINT
from tuner.study.settings import SearchSettings

Row = dict[str, Any]
DECISION_LEVEL = SearchSettings.__dataclass_fields__["decision_level"].default
CONFIRM_K = SearchSettings.__dataclass_fields__["confirm_k"].default
Rule = Callable[[list[Row], list[str], dict[str, float], float, int], Row | None]


def _mean(row: Row, keys: list[str], weights: dict[str, float], signal: str) -> tuple[float, float]:
    """Macro mean and one-sided 90% bound of ``signal`` over ``keys`` (a resample may repeat keys)."""
    values = [row["by_key"][k][signal] for k in keys]
    est = estimate(values, [weights[k] for k in keys], level=0.9, n_boot=300)
    return est.value, est.upper


def _front(rows: list[Row], keys: list[str], weights: dict[str, float], cap: float) -> list[Row]:
    """Validation Pareto front (FLOP speedup up, KL down) of the rows whose KL bound is within ``cap``,
    fastest first."""
    ok = []
    for r in rows:
        kl, kl_up = _mean(r, keys, weights, "kl")
        if kl_up <= cap:
            ok.append((r, kl))
    front = [
        (r, kl)
        for r, kl in ok
        if not any(
            o["flop_speedup"] >= r["flop_speedup"]
            and okl <= kl
            and (o is not r)
            and (o["flop_speedup"], okl) != (r["flop_speedup"], kl)
            for o, okl in ok
        )
    ]
    return [r for r, _ in sorted(front, key=lambda p: (-p[0]["flop_speedup"], p[1]))]


def direct(
    rows: list[Row], keys: list[str], weights: dict[str, float], budget: float, seed: int
) -> Row | None:
    for r in _front(rows, keys, weights, cap=0.05)[:3]:
        _, upper = _mean(r, keys, weights, "score")
        if upper <= budget:
            return r
    return None


def pooled(
    rows: list[Row],
    keys: list[str],
    weights: dict[str, float],
    budget: float,
    seed: int,
    *,
    kl_per_point: float = KL_PER_POINT,
    level: float = DECISION_LEVEL,
    k: int = CONFIRM_K,
) -> Row | None:
    front = _front(rows, keys, weights, cap=kl_per_point * budget)
    drifting = [r for r in front if _mean(r, keys, weights, "kl")[0] > 0]
    picks = spread(drifting, k)
    # a resample repeats keys: give each draw its own key so the calibration sees the resample
    draw = [f"{key}#{i}" for i, key in enumerate(keys)]
    w = {d: weights[key] for d, key in zip(draw, keys)}
    scored = [
        ScoredSchedule(i, {d: r["by_key"][key]["kl"] for d, key in zip(draw, keys)},
                       {d: r["by_key"][key]["score"] for d, key in zip(draw, keys)})
        for i, r in enumerate(picks)
    ]  # fmt: skip
    cal = fit(scored, w, level=level, n_boot=300, seed=seed)
    for r in front:
        kl = _mean(r, keys, weights, "kl")[0]
        if kl == 0:
            return r
        if cal is not None and cal.predicted(kl)[1] <= budget and cal.covers(kl):
            return r
    return None


RULES: dict[str, Rule] = {
    "direct (before the calibration)": direct,
    "pooled, k 3, cap 0.15 nats/point, level 0.9 (three rounds ago)": partial(
        pooled, kl_per_point=0.15, level=0.9, k=3
    ),
    f"pooled, k 3, cap {KL_PER_POINT:g} nats/point, level 0.6 (last round)": partial(pooled, level=0.6, k=3),
    **{
        f"pooled, k {k}, cap {KL_PER_POINT:g} nats/point, level {level:g}"
        + (" (default)" if (level, k) == (DECISION_LEVEL, CONFIRM_K) else ""): partial(pooled, level=level, k=k)
        for k, level in sorted({(CONFIRM_K, 0.6), (CONFIRM_K, 0.7), (CONFIRM_K, 0.8), (CONFIRM_K, 0.9), (8, DECISION_LEVEL),
                                (CONFIRM_K, DECISION_LEVEL)})
    },
}  # fmt: skip


def replay(rows: list[Row], budget: float, resamples: int) -> list[dict[str, Any]]:
    for r in rows:
        r["by_key"] = {e["key"]: e for e in r["examples"] if e["split"] == "validation"}
        test = [e for e in r["examples"] if e["split"] == "test"]
        r["test_loss"] = estimate(
            [e["score"] for e in test], macro_weights([e["dataset"] for e in test])
        ).value
    val = sorted(rows[0]["by_key"])
    datasets = {k: rows[0]["by_key"][k]["dataset"] for k in val}
    weights = dict(zip(val, macro_weights([datasets[k] for k in val])))
    best_ok = max((r["flop_speedup"] for r in rows if r["test_loss"] <= budget), default=1.0)
    rng = np.random.default_rng(0)
    by_ds: dict[str, list[str]] = {}
    for k in val:
        by_ds.setdefault(datasets[k], []).append(k)
    out = []
    for name, rule in RULES.items():
        errors, kept, none, picks = 0, [], 0, []
        for i in range(resamples):
            keys = [str(k) for ks in by_ds.values() for k in rng.choice(ks, size=len(ks), replace=True)]
            pick = rule(rows, keys, weights, budget, i)
            if pick is None:
                none += 1
                kept.append(1.0 / best_ok)
                continue
            picks.append(pick["schedule"])
            errors += pick["test_loss"] > budget
            kept.append(pick["flop_speedup"] / best_ok)
        common = max(set(picks), key=picks.count) if picks else "-"
        out.append({
            "rule": name, "resamples": resamples, "error_rate": errors / resamples,
            "speed_kept_mean": statistics.fmean(kept), "no_pick": none / resamples,
            "most_common_pick": common, "best_within_budget_on_test": best_ok,
        })  # fmt: skip
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--rows",
        default=str(Path(__file__).parent / "data" / "objective_noise_512.rows.jsonl"),
        help="rows of benchmarks/objective_noise.py (default: the committed 20-schedule grid)",
    )
    p.add_argument("--budget", type=float, default=2.0, help="task-score points")
    p.add_argument("--resamples", type=int, default=500)
    args = p.parse_args()
    rows = [json.loads(line) for line in Path(args.rows).read_text().splitlines() if line]
    n_val = sum(e["split"] == "validation" for e in rows[0]["examples"])
    n_test = len(rows[0]["examples"]) - n_val
    print(
        f"{len(rows)} schedules, {n_val} validation / {n_test} test examples, budget {args.budget} score points"
    )
    print(
        "| rule | (a) test loss over budget | (b) speed kept vs best within budget on test | no pick | most common pick |"
    )
    print("|---|---|---|---|---|")
    results = replay(rows, args.budget, args.resamples)
    for r in results:
        print(
            f"| {r['rule']} | {r['error_rate']:.1%} | {r['speed_kept_mean']:.2f} | {r['no_pick']:.1%} | {r['most_common_pick']} |"
        )
    print(
        f"best schedule within budget on test: {results[0]['best_within_budget_on_test']:.2f}x FLOP speedup"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
