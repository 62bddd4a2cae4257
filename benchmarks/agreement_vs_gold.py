"""Agreement loss against gold loss on the recorded open-QA grid: what a label-free budget means in gold points.

    python benchmarks/agreement_vs_gold.py [--rows GRID.jsonl ...] [--gold-budget 2] [--out benchmarks/data/agreement_vs_gold]

A prompts file without answers is budgeted in agreement points (:func:`tuner.data.metrics.agreement_score`:
the metric of a pruned answer against the unpruned model's own, 1 where they are the same text). Here,
on the rows of ``benchmarks/record_grid.py`` (every schedule's answer, the unpruned answer and the gold
answers per example), each schedule's gold loss (``100 x (score(unpruned) - score(pruned))`` against
the gold answers, ``qa_f1``) and agreement loss (``100 x (1 - agreement)``) are computed with the
product's own metric functions, macro-weighted over the datasets, each with its 90% paired bootstrap
interval (:func:`tuner.statistics.bootstrap.paired_estimate`).

The map from gold to agreement points is a straight line fitted over the schedules of one grid (the
unpruned control left out), ``agreement = a + b x gold``; its value at ``--gold-budget`` is the
agreement budget that corresponds to it, with a 90% interval from the cluster bootstrap over examples
(one draw of examples refits every schedule's means and the line). Grids of one prompt length (their
validation and test files) are pooled, and all of them together give the default. Writes
``<out>.json`` (every row) and ``<out>.md`` (the tables of docs/statistics.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner.data.metrics import agreement_score, score_example
from tuner.statistics.bootstrap import macro_weights, paired_estimate, resample_indices

DATA = Path(__file__).resolve().parent / "data"
ROWS = tuple(
    DATA / f"grid-smollm2-135m-openqa-{split}-{length}.jsonl"
    for length in ("1024", "2048-bfloat16")
    for split in ("validation", "test")
)
CONTROL = "keep-all (control)"
METRIC = "qa_f1"
LEVEL = 0.9
N_BOOT = 2000


@dataclass(frozen=True)
class Grid:
    """One prompt length: per schedule and example, the gold and the agreement loss (points)."""

    name: str
    schedules: tuple[str, ...]
    datasets: tuple[str, ...]  # per example
    gold: np.ndarray  # [S, N]
    agreement: np.ndarray  # [S, N]
    kl: np.ndarray  # [S, N] mean teacher-forced KL per answer token, nats


def read_grid(name: str, paths: Sequence[Path]) -> Grid:
    """The schedules every file holds on all of its examples, scored with the product's metrics."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                by.setdefault(row["schedule"], {})[f"{path.stem}/{row['example']}"] = row
    examples = sorted(set.intersection(*(set(rows) for rows in by.values())))
    schedules = tuple(s for s in by if len(by[s]) == len(examples))
    gold = np.empty((len(schedules), len(examples)))
    agree = np.empty_like(gold)
    kl = np.empty_like(gold)
    for s, schedule in enumerate(schedules):
        for i, key in enumerate(examples):
            row = by[schedule][key]
            pruned = score_example(METRIC, row["prediction"], row["answers"], None, False)
            unpruned = score_example(METRIC, row["baseline_prediction"], row["answers"], None, False)
            gold[s, i] = 100.0 * (unpruned - pruned)
            agree[s, i] = 100.0 * (
                1.0 - agreement_score(METRIC, row["prediction"], row["baseline_prediction"])
            )
            kl[s, i] = row["kl_nats_per_token"] or 0.0
    datasets = tuple(by[schedules[0]][key]["dataset"] for key in examples)
    return Grid(name, schedules, datasets, gold, agree, kl)


def shape_rows(grid: Grid) -> list[dict[str, Any]]:
    """How well ``loss = slope x KL^p`` (through the origin, over the schedules' macro means, control
    left out) fits each loss at p = 1 and 0.5: the calibration's two shapes."""
    w = np.asarray(macro_weights(grid.datasets))
    keep = [s for s, n in enumerate(grid.schedules) if n != CONTROL]
    kl = grid.kl[keep] @ w / w.sum()
    out = []
    for loss, values in (("gold", grid.gold), ("agreement", grid.agreement)):
        y = values[keep] @ w / w.sum()
        for p in (1.0, 0.5):
            x = kl**p
            slope = float(x @ y / (x @ x))
            r2 = 1.0 - float(np.sum((y - slope * x) ** 2) / np.sum((y - y.mean()) ** 2))
            out.append({"grid": grid.name, "loss": loss, "exponent": p, "slope": slope, "r2": r2})
    return out


def _line(gold: np.ndarray, agree: np.ndarray) -> tuple[float, float]:
    """(a, b) of the least-squares line ``agree = a + b x gold`` over schedules."""
    b, a = np.polyfit(gold, agree, 1)
    return float(a), float(b)


@dataclass(frozen=True)
class Mapping:
    """The line over one set of schedules, and the agreement budget at the gold budget with its interval."""

    name: str
    n_examples: int
    n_schedules: int
    intercept: float
    slope: float
    gold_budget: float
    agreement_budget: float
    low: float
    high: float
    level: float


def mapping(name: str, grids: Sequence[Grid], gold_budget: float, *, seed: int = 0) -> Mapping:
    """The line over the schedules of ``grids`` (control left out), each grid's examples resampled."""

    def means(grid: Grid, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = np.asarray(macro_weights(grid.datasets))[idx]
        keep = [s for s, n in enumerate(grid.schedules) if n != CONTROL]
        return (grid.gold[keep][:, idx] @ w / w.sum(), grid.agreement[keep][:, idx] @ w / w.sum())

    def fit(draws: Sequence[np.ndarray]) -> float:
        parts = [means(g, idx) for g, idx in zip(grids, draws)]
        a, b = _line(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        return a + b * gold_budget

    full = [np.arange(g.gold.shape[1]) for g in grids]
    parts = [means(g, idx) for g, idx in zip(grids, full)]
    a, b = _line(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    boots = [
        resample_indices(g.gold.shape[1], list(g.datasets), n_boot=N_BOOT, seed=seed + k)
        for k, g in enumerate(grids)
    ]
    values = np.array([fit([draw[b_] for draw in boots]) for b_ in range(N_BOOT)])
    lo, hi = np.quantile(values, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return Mapping(
        name, sum(g.gold.shape[1] for g in grids), sum(len(p[0]) for p in parts), a, b, gold_budget,
        a + b * gold_budget, float(lo), float(hi), LEVEL,
    )  # fmt: skip


def schedule_rows(grid: Grid) -> list[dict[str, Any]]:
    """Per schedule: its gold and agreement loss with their 90% paired bootstrap intervals."""
    w = macro_weights(grid.datasets)
    out = []
    for s, name in enumerate(grid.schedules):
        gold = paired_estimate(list(grid.gold[s]), [0.0] * grid.gold.shape[1], w, level=LEVEL)
        agree = paired_estimate(list(grid.agreement[s]), [0.0] * grid.gold.shape[1], w, level=LEVEL)
        out.append(
            {
                "grid": grid.name,
                "schedule": name,
                "n": gold.n,
                "gold": gold.to_dict(),
                "agreement": agree.to_dict(),
            }
        )
    return out


def markdown(
    rows: Sequence[dict[str, Any]], maps: Sequence[Mapping], shapes: Sequence[dict[str, Any]]
) -> str:
    lines = [
        "| grid | schedule | n | gold loss [90%] | agreement loss [90%] |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        g, a = r["gold"], r["agreement"]
        lines.append(
            f"| {r['grid']} | {r['schedule']} | {r['n']} | {g['value']:.2f} [{g['low']:.2f}, {g['high']:.2f}] "
            f"| {a['value']:.2f} [{a['low']:.2f}, {a['high']:.2f}] |"
        )
    lines += [
        "",
        "| schedules of | n examples | schedules | line (agreement = a + b x gold) | agreement points at "
        f"{maps[0].gold_budget:g} gold points [90%] |",
        "|---|---:|---:|---|---:|",
    ]
    for m in maps:
        lines.append(
            f"| {m.name} | {m.n_examples} | {m.n_schedules} | {m.intercept:.1f} + {m.slope:.2f} x gold "
            f"| {m.agreement_budget:.1f} [{m.low:.1f}, {m.high:.1f}] |"
        )
    lines += [
        "",
        "| grid | loss | p | slope (points per nat^p) | R^2 over schedules |",
        "|---|---|---:|---:|---:|",
    ]
    for r in shapes:
        lines.append(f"| {r['grid']} | {r['loss']} | {r['exponent']:g} | {r['slope']:.1f} | {r['r2']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", nargs="+", type=Path, default=list(ROWS), help="record_grid.py rows files")
    p.add_argument("--gold-budget", type=float, default=2.0, help="the gold budget to map (default: 2)")
    p.add_argument("--out", type=Path, default=DATA / "agreement_vs_gold", help="output stem (.json, .md)")
    args = p.parse_args(argv)
    by_length: dict[str, list[Path]] = {}
    for path in args.rows:
        length = (
            path.stem.split("-")[-1]
            if not path.stem.endswith("bfloat16")
            else "-".join(path.stem.split("-")[-2:])
        )
        by_length.setdefault(length, []).append(path)
    grids = [read_grid(length, paths) for length, paths in by_length.items()]
    rows = [r for g in grids for r in schedule_rows(g)]
    maps = [mapping(g.name, [g], args.gold_budget) for g in grids]
    if len(grids) > 1:
        maps.append(mapping("all", grids, args.gold_budget))
    data = {
        "date": dt.date.today().isoformat(),
        "metric": METRIC,
        "level": LEVEL,
        "rows_files": [
            str(p.relative_to(DATA.parent.parent) if p.is_relative_to(DATA.parent.parent) else p)
            for p in args.rows
        ],
        "schedules": rows,
        "mappings": [asdict(m) for m in maps],
    }
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    shapes = [r for g in grids for r in shape_rows(g)]
    data["shapes"] = shapes
    text = markdown(rows, maps, shapes)
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
