"""Fit a model's slope prior (task-score points per nat of KL) on the recorded open-QA grid.

    python benchmarks/slope_prior.py [--rows benchmarks/data/grid-smollm2-135m-openqa-validation-1024.jsonl]
        [--power benchmarks/data/decision_rule.openqa.json] [--out tuner/statistics/priors/<model>-<tokens>.json]

Reads the validation rows of ``benchmarks/record_grid.py``: every LazyLLM schedule with a KL (while
the grid is being recorded, those on at least half as many examples as the fullest), on the examples
all of them share, macro-weighted over the datasets. Fits the pooled slope through the
origin with the product's own estimator (:func:`tuner.statistics.calibration.bootstrap_slopes`, the
cluster bootstrap over examples a study's calibration uses) and records its one-sided bounds at
levels 0.50..0.99. ``--exponent p`` fits ``loss = slope x KL^p`` instead of the straight line (a file of its own,
``<model>-<tokens>-p<p>.json``, read by studies with ``--calibration-exponent p``). ``--power`` adds the power curve that ``benchmarks/decision_rule.py --out``
measured on the same grid (the rule without a prior), which says from how many examples a study's
own calibration needs no floor. The file records the rows' sha256, so the report names exactly what
it was fitted on (:attr:`tuner.statistics.prior.SlopePrior.id`). See :mod:`tuner.statistics.prior`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuner.data.longbench import unit_hash
from tuner.statistics.bootstrap import macro_weights, weighted_mean
from tuner.statistics.calibration import ScoredSchedule, bootstrap_slopes, pooled_slope
from tuner.statistics.prior import (
    COMBINES,
    SCALINGS,
    PowerPoint,
    SlopePrior,
    packaged_path,
    power_points,
    sha256_of,
)
from tuner.statistics.shape import LINEAR, check_exponent

LEVELS = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))  # 0.50 .. 0.99
N_BOOT = 4000
HOLDOUT_SEED = 7919  # benchmarks/decision_rule.py's (a test checks they agree)
MIN_PACKAGED = 200
"""A packaged prior rests on at least this many validation examples (issue 30: a calibration with
power); a thinner one would floor studies at a slope its own noise could not tell from zero."""


def distinct(path: Path, rows: dict[str, dict[str, Any]]) -> list[str]:
    """The recorded schedules, one name per distinct schedule (an older grid may hold one schedule
    under two names: the one with more rows stays)."""
    table = json.loads(path.with_suffix(".schedules.json").read_text(encoding="utf-8"))
    best: dict[str, str] = {}
    for name in sorted(rows, key=lambda n: -len(rows[n])):
        if table[name].get("family") != "control":  # the recorder's keep-all: noise, not a cost of KL
            best.setdefault(json.dumps(table[name]["schedule"], sort_keys=True), name)
    return sorted(best.values())


def scored_schedules(
    path: Path, holdout: float | None = None
) -> tuple[list[ScoredSchedule], list[str], dict[str, float], float, dict[str, str]]:
    """The grid's LazyLLM schedules as scored evidence on the examples all of them hold (with
    ``holdout``: only those ``benchmarks/decision_rule.py --holdout`` keeps in its pool), their names,
    the macro weights, the unpruned score on those examples (points, macro over datasets) and each
    example's dataset."""
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            if r.get("kl_nats_per_token") is not None:
                rows.setdefault(r["schedule"], {})[r["example"]] = r
    if not rows:
        raise SystemExit(
            f"{path}: no LazyLLM rows with a KL; record the grid first (benchmarks/record_grid.py)"
        )
    names = distinct(path, rows)
    most = max(len(rows[n]) for n in names)  # a grid still being recorded: its fuller schedules
    names = [n for n in names if 2 * len(rows[n]) >= most]
    keys = sorted(set.intersection(*(set(rows[n]) for n in names)))
    if holdout is not None:
        keys = [k for k in keys if not unit_hash(HOLDOUT_SEED, k) < holdout]
    if not keys:
        raise SystemExit(f"{path}: the schedules share no example yet; record more of the grid")
    first = rows[names[0]]
    weights = dict(zip(keys, macro_weights([first[k]["dataset"] for k in keys])))
    scored = [
        ScoredSchedule(
            i,
            {k: float(rows[n][k]["kl_nats_per_token"]) for k in keys},
            {k: 100.0 * (rows[n][k]["baseline_score"] - rows[n][k]["score"]) for k in keys},
        )
        for i, n in enumerate(names)
    ]
    baseline = weighted_mean([100.0 * first[k]["baseline_score"] for k in keys], [weights[k] for k in keys])
    return scored, names, weights, baseline, {k: first[k]["dataset"] for k in keys}


def fit_slope(
    scored: Sequence[ScoredSchedule], weights: dict[str, float], exponent: float = LINEAR
) -> tuple[float, tuple[tuple[float, float], ...], np.ndarray, np.ndarray] | None:
    """The pooled slope at ``exponent`` (``loss = slope x KL^p``), its bounds at :data:`LEVELS` and the
    schedules' mean KL and task loss, by the calibration's own estimator (None: nothing drifted)."""
    boot = bootstrap_slopes(scored, weights, n_boot=N_BOOT, exponent=exponent)
    if boot is None:
        return None
    _, kl_means, tl_means, slopes = boot
    bounds = tuple((lv, float(np.quantile(slopes, lv))) for lv in LEVELS)
    return pooled_slope(kl_means, tl_means, exponent), bounds, kl_means, tl_means


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", default="benchmarks/data/grid-smollm2-135m-openqa-validation-1024.jsonl")
    p.add_argument("--model", default="smollm2-135m", help="the model the grid was recorded on")
    p.add_argument("--task", default="openqa")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--power", default=None, help="benchmarks/decision_rule.py --out JSON on the same grid")
    p.add_argument(
        "--scaling",
        choices=SCALINGS,
        default="absolute",
        help="baseline: read the slope relative to the unpruned score, rescaled to each study's",
    )
    p.add_argument(
        "--combine",
        choices=COMBINES,
        default="macro",
        help="steepest: the largest of the datasets' own slopes and bounds (the most sensitive task measured)",
    )
    p.add_argument(
        "--holdout",
        type=float,
        default=None,
        help="fit only on the pool side of decision_rule.py --holdout (to replay it with --prior unbiased)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="default: tuner/statistics/priors/<model>-<tokens>.json (tokens: the grid's prompt length)",
    )
    p.add_argument(
        "--min-examples",
        type=int,
        default=MIN_PACKAGED,
        help="fewest shared examples a prior written into the package may rest on",
    )
    p.add_argument(
        "--exponent",
        type=float,
        default=LINEAR,
        help="the calibration's shape p, task loss = slope x KL^p (studies with --calibration-exponent p read it)",
    )
    args = p.parse_args(argv)
    try:
        check_exponent(args.exponent)
    except ValueError as e:
        p.error(str(e))
    rows = Path(args.rows)
    scored, names, weights, baseline, datasets = scored_schedules(rows, args.holdout)
    shared = len(set.intersection(*(set(s.kl) for s in scored)))
    if args.out is None and shared < args.min_examples:
        raise SystemExit(
            f"{rows}: the schedules share {shared} validation examples, fewer than the {args.min_examples} a "
            "packaged prior rests on (studies would read it); record more of the grid, or write it elsewhere "
            "with --out to look at it"
        )
    fit = fit_slope(scored, weights, args.exponent)
    if fit is None:
        raise SystemExit(f"{rows}: no schedule drifted; nothing to fit")
    slope, bounds, kl_means, tl_means = fit
    by_dataset: dict[str, list[str]] = {}
    for key in sorted(weights):
        by_dataset.setdefault(datasets[key], []).append(key)
    per_dataset = []
    for name, ks in sorted(by_dataset.items()):
        part = [
            ScoredSchedule(s.trial, {k: s.kl[k] for k in ks}, {k: s.task_loss[k] for k in ks}) for s in scored
        ]
        got = fit_slope(part, dict.fromkeys(ks, 1.0), args.exponent)
        if got is not None:
            per_dataset.append((name, len(ks), got[0], got[1]))
    if args.combine == "steepest":
        if not per_dataset:
            raise SystemExit(f"{rows}: no dataset has a schedule that drifted; nothing to fit")
        slope = max(d[2] for d in per_dataset)
        bounds = tuple((lv, max(dict(d[3])[lv] for d in per_dataset)) for lv in LEVELS)
    power: tuple[PowerPoint, ...] = ()
    if args.power:
        payload = json.loads(Path(args.power).read_text(encoding="utf-8"))
        power = power_points(payload["power"])
        if payload.get("exponent", LINEAR) != args.exponent:
            raise SystemExit(
                f"--power {args.power} replayed the rule at exponent {payload.get('exponent', LINEAR):g}, not "
                f"{args.exponent:g}: replay it with decision_rule.py --exponent {args.exponent:g}"
            )
    prior = SlopePrior(
        model=args.model,
        task=args.task,
        max_prompt_tokens=args.max_prompt_tokens,
        n_examples=len(weights),
        schedules=tuple(names),
        slope=slope,
        bounds=bounds,
        source=rows.as_posix(),
        source_sha256=sha256_of(rows),
        created=dt.date.today().isoformat(),
        power=power,
        baseline_score=baseline,
        scaling=args.scaling,
        combine=args.combine,
        datasets=tuple((d[0], d[1], d[2]) for d in per_dataset),
        exponent=args.exponent,
    )
    out = prior.save(args.out or packaged_path(args.model, args.max_prompt_tokens, args.exponent))
    print(
        f"{prior.id}: slope {prior.slope:.2f} {prior.unit} (bound {prior.upper(0.6):.2f} at 60%, "
        f"{prior.upper(0.9):.2f} at 90%) on {len(weights)} examples x {len(names)} schedules, unpruned score "
        f"{baseline:.1f}, {args.scaling}, {args.combine} -> {out}"
    )
    for dataset, count, s_d, b_d in per_dataset:
        print(
            f"  {dataset}: slope {s_d:.2f} (bound {dict(b_d)[0.6]:.2f} at 60%, {dict(b_d)[0.9]:.2f} at 90%) on {count} examples"
        )
    for name, k, t in zip(names, kl_means, tl_means):
        print(f"  {name:48s} KL {k:.3f} nats  task loss {t:6.2f} points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
