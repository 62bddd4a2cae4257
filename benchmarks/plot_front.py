"""The Pareto front a study wrote (its ``pareto.json``) as a picture, the pick starred.

    python benchmarks/plot_front.py benchmarks/data/longbench-qa-2026-12-04/seed0.pareto.json \\
        --title "LongBench QA, SmolLM2-135M, seed 0 (2026-12-04)" --out docs/pareto.png

A study draws every trial (``tuner/report/plots.py``), but only its front is kept with the results
under ``benchmarks/data/``; this draws that front from the file alone, so the README's picture is the
run its table reports. Each front schedule is a point (speedup, search loss) with its interval; the
confirmation's verdict marks it (task-scored, confirmed), and the recommended trial is a star.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.report.figure import pyplot, write_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KINDS = {"flops": "FLOP model", "measured": "measured TTFT", "total": "measured whole generation"}


def front_figure(rows: Sequence[dict[str, Any]], title: str) -> Figure:
    """The front of ``rows`` (``pareto.json`` entries), sorted by speedup, the recommended one starred."""
    if not rows:
        raise ValueError("the pareto file holds no trial")
    plt = pyplot()
    rows = sorted(rows, key=lambda r: r["speedup"])
    fig, ax = plt.subplots(figsize=(7, 4.6))
    xs, ys = [r["speedup"] for r in rows], [r["accuracy_loss"] for r in rows]
    low = [y - r["accuracy_loss_interval"][0] for r, y in zip(rows, ys, strict=True)]
    high = [r["accuracy_loss_interval"][1] - y for r, y in zip(rows, ys, strict=True)]
    ax.errorbar(xs, ys, yerr=[low, high], fmt="o-", c="C0", ms=5, lw=1.2, capsize=2, label="Pareto front")
    scored = [r for r in rows if r.get("confirmation") in ("scored", "confirmed")]
    ax.scatter([r["speedup"] for r in scored], [r["accuracy_loss"] for r in scored], s=70, facecolors="none",
               edgecolors="C2", lw=1.5, zorder=4, label="task-scored by the confirmation")  # fmt: skip
    for r in rows:
        ax.annotate(str(r["trial"]), (r["speedup"], r["accuracy_loss"]), textcoords="offset points",
                    xytext=(4, 5), fontsize=7)  # fmt: skip
    picks = [r for r in rows if r.get("recommended")]
    for r in picks:
        ax.scatter([r["speedup"]], [r["accuracy_loss"]], marker="*", s=280, c="C1", edgecolors="black",
                   zorder=5, label=f"recommended: trial {r['trial']}")  # fmt: skip
    kind = rows[0].get("speedup_kind", "")
    ax.set_xlabel(f"speedup ({KINDS.get(kind, kind)}, x)")
    ax.set_ylabel(f"drift: mean KL per answer token ({rows[0].get('accuracy_loss_unit', '')})")
    n = {r.get("examples_run") for r in rows} - {None}
    examples = f", {n.pop()} validation examples per point" if len(n) == 1 else ""
    ax.set_title(f"{title}\n{len(rows)} front schedules{examples}; bars: 90% intervals", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("pareto", type=Path, help="a study's pareto.json")
    p.add_argument("--title", default="", help="the figure's first title line (say which run)")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = p.parse_args(argv)
    rows = json.loads(args.pareto.read_text())
    write_figure(front_figure(rows, args.title or args.pareto.name), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
