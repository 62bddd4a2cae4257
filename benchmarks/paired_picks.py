"""Can the test losses of two or more schedules be told apart? Paired, on the same examples.

    python benchmarks/paired_picks.py seed0=DIR0/lazyllm.jsonl seed1=DIR1/lazyllm.jsonl [...] [--level 0.9]

Reads the per-example rows (``<method>.jsonl``) that ``tuner.evaluate`` wrote for each schedule on
the same split, and prints, for every pair, ``loss(A) - loss(B)`` in score points (= B's score - A's
score, macro over datasets) with its paired bootstrap interval: the estimator of ``tuner.evaluate``'s
Table 3 (:func:`tuner.evaluation.runner.loss_estimate`), with B's rows in the baseline's place. The
unpruned baseline cancels out of a paired difference, so it is not read.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.evaluation.runner import ExampleResult, loss_estimate
from tuner.statistics.bootstrap import Estimate


@dataclass(frozen=True)
class PairedDifference:
    """``loss(first) - loss(second)`` on the examples both hold."""

    first: str
    second: str
    diff: Estimate

    @property
    def apart(self) -> bool:
        """Whether the interval excludes zero."""
        return self.diff.low > 0 or self.diff.high < 0

    def line(self) -> str:
        d = self.diff
        verdict = "differ" if self.apart else "cannot be told apart"
        return (
            f"{self.first} - {self.second}: {d.value:+.2f} score points "
            f"({d.level:.0%} interval {d.low:+.2f} to {d.high:+.2f}, n={d.n}): {verdict}"
        )


def compare(
    runs: Sequence[tuple[str, Sequence[ExampleResult]]], level: float = 0.9
) -> list[PairedDifference]:
    """Every pair of ``runs`` (name, rows), paired on their examples, which must be the same."""
    keys = {name: sorted((r.dataset, r.record_id) for r in rows) for name, rows in runs}
    first = runs[0][0]
    for name, k in keys.items():
        if k != keys[first]:
            raise ValueError(
                f"{name} and {first} were evaluated on different examples: run tuner.evaluate with the same "
                "--split, --n-examples and data for every schedule"
            )
    return [
        PairedDifference(a, b, loss_estimate(list(ra), list(rb), level=level))
        for (a, ra), (b, rb) in itertools.combinations(runs, 2)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="NAME=PATH of a tuner.evaluate <method>.jsonl (two or more)")
    p.add_argument("--level", type=float, default=0.9, help="interval level (default: 0.9)")
    args = p.parse_args(argv)
    named = [r.partition("=") for r in args.runs]
    if len(named) < 2 or any(not sep or not name for name, sep, _ in named):
        p.error("give two or more runs as NAME=PATH")
    try:
        runs = [(name, ExampleResult.read_jsonl(Path(path))) for name, _, path in named]
        for diff in compare(runs, args.level):
            print(diff.line())
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
