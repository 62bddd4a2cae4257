"""Did the decision's predicted task loss hold on test? Each study's prediction for its pick against
the pick's test loss, and how typical the unpruned score that scaled the prediction was.

    python benchmarks/prediction_check.py NAME=STUDY_DIR [...] [--pool NAME=A,B,C] [--level 0.9]
        [--draws 20000] [--validation NAME=BASELINE.jsonl] [--test-rows NAME=DIR] [--out-dir DIR]

A STUDY_DIR holds what ``tuner.search`` wrote for a study (``confirmation.json``: the calibration that
decided and the pick's KL at the target length) and the pick's test rows from ``tuner.evaluate``
(one ``<prefix>.baseline.jsonl`` and ``<prefix>.lazyllm.jsonl``, as the long-prompt studies'
folders under ``benchmarks/data/`` keep them). Per study:

* **predicted**: the calibration's task loss at the pick's KL (:meth:`Calibration.predicted`, the
  function the decision called: point and the bound at the decision level) and its bound at the
  study's ``--confidence`` (:meth:`Calibration.upper_at_confidence`);
* **test**: the pick's loss on the test rows (:func:`tuner.evaluation.runner.loss_estimate`, the
  estimator of ``tuner.evaluate``'s Table 3), with its interval at ``--level``;
* **unpruned score**: where the prediction came from a slope prior's floor rescaled to the study's
  unpruned validation score, that score against the test split's: the share of ``--draws`` draws of
  as many test records per dataset as the calibration had (without replacement) whose macro score is
  no higher than the validation score, and the draws' 5-95% range. A validation score in the draws'
  low tail scaled the floor down for a task that has more to lose.

``--validation NAME=FILE`` gives the unpruned model's rows on study NAME's calibration records
(``tuner.evaluate --split validation --methods baseline`` with the study's per-dataset count): the
study's own fit is floored again (:meth:`Calibration.floored`, the packaged prior it names) with the
score and its bound measured on those rows (:class:`UnprunedScore`), and the table adds the pick's
bound at confidence as the rule of 2026-12-07 reads it.

``--test-rows NAME=DIR`` reads study NAME's test rows from DIR, the folder of an earlier decision
that picked the same schedule (both folders' ``recommended.json`` must hold it), so that a study
decided again keeps its own prediction without running its pick on test twice.

``--pool NAME=A,B,C`` reads studies whose picks ran on the same test records together: the picks'
scores are averaged per record and that average's loss is set against the mean prediction, so that
three seeds' picks say with one interval whether the predictions were too low on the whole. The
table goes to stdout and, with ``--out-dir``, to ``rows.md`` and ``rows.json`` with a figure
``check.png`` (predicted against test, with the intervals and n).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner.evaluation.runner import ExampleResult, loss_estimate, macro_score
from tuner.report.figure import pyplot, write_figure
from tuner.stages.confirm import unpruned_score
from tuner.statistics.bootstrap import Estimate
from tuner.statistics.calibration import Calibration
from tuner.statistics.prior import SlopePrior, packaged_all


@dataclass(frozen=True)
class ScoreDraws:
    """The study's unpruned validation score against draws of as many records per dataset from the
    test split's unpruned rows (points)."""

    validation: float
    per_dataset: int
    at_or_below: float
    low: float
    high: float


@dataclass(frozen=True)
class Refloored:
    """The pick's bound at confidence with the study's own fit floored again at the unpruned score and
    its bound, measured on the unpruned rows of the study's calibration records (points)."""

    score: float
    score_upper: float
    n: int
    bound_confidence: float


@dataclass(frozen=True)
class Check:
    """One study's (or a pool's) prediction for its pick against the pick's test loss (points)."""

    name: str
    trials: tuple[int, ...]
    kl: float
    predicted: float
    bound: float
    bound_confidence: float | None
    test: Estimate
    test_unpruned: float
    draws: ScoreDraws | None = None
    refloored: Refloored | None = None

    @property
    def inside(self) -> bool:
        """Whether the test interval holds the point prediction."""
        return self.test.low <= self.predicted <= self.test.high

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["test"] = {k: getattr(self.test, k) for k in ("value", "low", "high", "upper", "level", "n")}
        data["inside"] = self.inside
        return data


@dataclass(frozen=True)
class Study:
    """What a study folder holds: the decision's calibration, the pick and its test rows."""

    name: str
    calibration: Calibration
    trial: int
    kl: float
    baseline: list[ExampleResult]
    pick: list[ExampleResult]
    budget: float = 2.0


def _schedule(folder: Path) -> dict[str, object]:
    """``folder``'s recommended schedule without its metadata (which names the study and its run)."""
    path = folder / "recommended.json"
    if not path.is_file():
        raise ValueError(
            f"{folder} has no recommended.json: --test-rows needs both folders' picks to compare"
        )
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if k != "metadata"}


def read_study(name: str, folder: Path, test_folder: Path | None = None) -> Study:
    """The study in ``folder`` (see the module docstring); a clear ValueError when a file is missing.

    ``test_folder``: read the pick's test rows there instead (a study decided again that picked the
    schedule an earlier decision's folder already ran on test); both folders must recommend it.
    """
    conf_path = folder / "confirmation.json"
    if not conf_path.is_file():
        raise ValueError(f"{folder} has no confirmation.json: give the folder tuner.search wrote for a study")
    conf = json.loads(conf_path.read_text())
    trial = conf.get("recommended_trial")
    picked = [c for c in conf.get("candidates", []) if c.get("trial") == trial]
    if trial is None or not picked:
        raise ValueError(f"{conf_path} recommends no schedule: there is no pick to check")
    rows_folder = folder if test_folder is None else test_folder
    if test_folder is not None and _schedule(folder) != _schedule(test_folder):
        raise ValueError(
            f"{test_folder} recommends another schedule than {folder}: --test-rows must name a run of the same pick"
        )
    bases = sorted(rows_folder.glob("*.baseline.jsonl"))
    if len(bases) != 1:
        raise ValueError(
            f"{rows_folder} holds {len(bases)} *.baseline.jsonl files: keep exactly one tuner.evaluate test run "
            "(<prefix>.baseline.jsonl and <prefix>.lazyllm.jsonl) beside confirmation.json"
        )
    pick_path = bases[0].with_name(bases[0].name.replace(".baseline.jsonl", ".lazyllm.jsonl"))
    if not pick_path.is_file():
        raise ValueError(f"{rows_folder} lacks {pick_path.name} beside {bases[0].name}")
    return Study(
        name=name,
        calibration=Calibration.from_dict(conf["calibration"]),
        trial=int(trial),
        kl=float(picked[0]["search_loss"]),
        baseline=ExampleResult.read_jsonl(bases[0]),
        pick=ExampleResult.read_jsonl(pick_path),
        budget=float(conf.get("budget", 2.0)),
    )


def score_draws(study: Study, n_draws: int, seed: int = 0) -> ScoreDraws | None:
    """:class:`ScoreDraws` for a study whose floor was rescaled to its unpruned score (None otherwise)."""
    floor = study.calibration.floor
    if floor is None or floor.baseline_score is None or n_draws <= 0:
        return None
    by_dataset: dict[str, list[ExampleResult]] = {}
    for r in study.baseline:
        by_dataset.setdefault(r.dataset, []).append(r)
    k = max(1, round(study.calibration.n_examples / len(by_dataset)))
    rng = np.random.default_rng(seed)
    scores = np.array(
        [
            macro_score(
                [
                    rows[i]
                    for rows in by_dataset.values()
                    for i in rng.choice(len(rows), min(k, len(rows)), replace=False)
                ]
            )
            for _ in range(n_draws)
        ]
    )
    return ScoreDraws(
        validation=float(floor.baseline_score),
        per_dataset=k,
        at_or_below=float(np.mean(scores <= floor.baseline_score)),
        low=float(np.quantile(scores, 0.05)),
        high=float(np.quantile(scores, 0.95)),
    )


def _prior_named(prior_id: str, exponent: float) -> SlopePrior:
    for prior in packaged_all(prior_id.split("/", 1)[0], exponent):
        if prior.id == prior_id:
            return prior
    raise ValueError(
        f"no packaged slope prior has the id {prior_id}: the study was floored at one not shipped here"
    )


def refloor(study: Study, rows: Sequence[ExampleResult]) -> Refloored:
    """``study``'s own fit floored again at the unpruned score and its bound at the calibration's
    confidence, measured on ``rows``; refused when flooring it at its recorded score does not give back
    the recorded calibration."""
    cal, floor = study.calibration, study.calibration.floor
    if floor is None or floor.baseline_score is None or cal.confidence is None:
        raise ValueError(
            f"{study.name}: its calibration was not floored at a prior scaled by the unpruned score"
        )
    prior = _prior_named(floor.prior, cal.exponent)
    own = dataclasses.replace(
        cal, slope=floor.own_slope, slope_upper=floor.own_upper, slope_upper_confidence=floor.own_upper_confidence,
        floor=None,
    )  # fmt: skip
    again = own.floored(prior, study.budget, floor.baseline_score)
    if not np.isclose(again.slope_upper_confidence or 0.0, cal.slope_upper_confidence or 0.0):
        raise ValueError(f"{study.name}: flooring its own fit again does not give back its calibration")
    score = unpruned_score(rows, cal.confidence)  # what confirm hands the rule
    now = own.floored(prior, study.budget, score).upper_at_confidence(study.kl)
    assert now is not None
    return Refloored(score.value, score.upper, score.n, now)


def check(study: Study, level: float = 0.9, n_draws: int = 0, rows: Sequence[ExampleResult] = ()) -> Check:
    """``study``'s prediction for its pick against the pick's test loss."""
    point, bound = study.calibration.predicted(study.kl)
    return Check(
        name=study.name,
        trials=(study.trial,),
        kl=study.kl,
        predicted=point,
        bound=bound,
        bound_confidence=study.calibration.upper_at_confidence(study.kl),
        test=loss_estimate(study.pick, study.baseline, level=level),
        test_unpruned=macro_score(study.baseline),
        draws=score_draws(study, n_draws),
        refloored=refloor(study, rows) if rows else None,
    )


def pooled(name: str, studies: Sequence[Study], level: float = 0.9) -> Check:
    """The picks of ``studies`` (same test records) averaged per record, against their mean prediction."""
    keys = [sorted((r.dataset, r.record_id) for r in s.pick) for s in studies]
    if any(k != keys[0] for k in keys):
        raise ValueError(
            f"pool {name}: its studies' picks ran on different test records; pool only the same split"
        )
    scores: dict[tuple[str, str], list[float]] = {}
    for s in studies:
        for r in s.pick:
            scores.setdefault((r.dataset, r.record_id), []).append(r.score)
    mean_pick = [
        dataclasses.replace(r, score=statistics.fmean(scores[(r.dataset, r.record_id)]))
        for r in studies[0].pick
    ]
    predicted = [s.calibration.predicted(s.kl) for s in studies]
    bounds_conf = [s.calibration.upper_at_confidence(s.kl) for s in studies]
    return Check(
        name=name,
        trials=tuple(s.trial for s in studies),
        kl=statistics.fmean(s.kl for s in studies),
        predicted=statistics.fmean(p for p, _ in predicted),
        bound=statistics.fmean(b for _, b in predicted),
        bound_confidence=None
        if None in bounds_conf
        else statistics.fmean(b for b in bounds_conf if b is not None),
        test=loss_estimate(mean_pick, studies[0].baseline, level=level),
        test_unpruned=macro_score(studies[0].baseline),
    )


def table(checks: Sequence[Check]) -> str:
    """The markdown table of ``checks``."""
    level = checks[0].test.level if checks else 0.9
    lines = [
        f"| study | pick | KL (nats) | predicted [decision bound, bound at confidence] | test loss [{level:.0%}] | n "
        "| prediction inside | unpruned score: validation / test | draws at or below validation [5-95%] "
        "| bound at confidence read at the score's bound [score re-measured, its bound] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        conf = "-" if c.bound_confidence is None else f"{c.bound_confidence:.2f}"
        d = c.draws
        val = f"{d.validation:.2f} / {c.test_unpruned:.2f}" if d else f"- / {c.test_unpruned:.2f}"
        share = (
            f"{d.at_or_below:.1%} of draws of {d.per_dataset} per dataset [{d.low:.1f}-{d.high:.1f}]"
            if d
            else "-"
        )
        r = c.refloored
        now = "-" if r is None else f"{r.bound_confidence:.2f} [{r.score:.2f}, {r.score_upper:.2f}, n={r.n}]"
        pick = "mean of " + ", ".join(f"#{t}" for t in c.trials) if len(c.trials) > 1 else f"#{c.trials[0]}"
        lines.append(
            f"| {c.name} | {pick} | {c.kl:.4f} | {c.predicted:.2f} [{c.bound:.2f}, {conf}] "
            f"| {c.test.value:.2f} [{c.test.low:.2f}, {c.test.high:.2f}] | {c.test.n} "
            f"| {'yes' if c.inside else 'no'} | {val} | {share} | {now} |"
        )
    return "\n".join(lines) + "\n"


def plot(checks: Sequence[Check], path: Path) -> None:
    """Predicted (point, decision bound, bound at confidence) against test loss with its interval, one
    column per check."""
    fig, ax = pyplot().subplots(figsize=(max(6.0, 0.9 * len(checks) + 2), 4.2))
    x = np.arange(len(checks))
    ax.errorbar(
        x + 0.1,
        [c.test.value for c in checks],
        yerr=[[c.test.value - c.test.low for c in checks], [c.test.high - c.test.value for c in checks]],
        fmt="o",
        color="tab:blue",
        capsize=3,
        label=f"test loss, {checks[0].test.level:.0%} interval",
    )
    ax.scatter(x - 0.1, [c.predicted for c in checks], marker="x", color="tab:red", label="predicted")
    ax.scatter(x - 0.1, [c.bound for c in checks], marker="_", s=200, color="tab:red", label="decision bound")
    conf = [(i, c.bound_confidence) for i, c in enumerate(checks) if c.bound_confidence is not None]
    ax.scatter(
        [i - 0.1 for i, _ in conf],
        [b for _, b in conf],
        marker="v",
        color="tab:orange",
        label="bound at confidence",
    )
    ax.axhline(2.0, color="grey", linestyle="--", linewidth=1, label="2-point budget")
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.set_xticks(x, [f"{c.name}\nn={c.test.n}" for c in checks], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("task loss (score points)")
    ax.set_title("The decision's predicted loss for its pick against the pick's test loss")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    write_figure(fig, path)


def _named(items: Sequence[str], what: str) -> list[tuple[str, str]]:
    named = [item.partition("=") for item in items]
    bad = [
        item for item, (name, sep, value) in zip(items, named, strict=True) if not (name and sep and value)
    ]
    if bad:
        raise ValueError(
            f"{what} {bad[0]!r} is not NAME=VALUE: write e.g. seed0=benchmarks/data/.../qa-4k-seed0"
        )
    return [(name, value) for name, _, value in named]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("studies", nargs="+", help="NAME=STUDY_DIR (see the module docstring)")
    p.add_argument(
        "--pool", action="append", default=[], help="NAME=A,B,C: studies' picks on the same test records"
    )
    p.add_argument("--level", type=float, default=0.9, help="test intervals' level (default: 0.9)")
    p.add_argument("--draws", type=int, default=20000, help="draws of the unpruned-score check (0: skip it)")
    p.add_argument(
        "--validation",
        action="append",
        default=[],
        help="NAME=FILE: unpruned rows on study NAME's calibration records",
    )
    p.add_argument(
        "--test-rows",
        action="append",
        default=[],
        help="NAME=DIR: study NAME's pick ran on test in DIR (an earlier decision of the same pick)",
    )
    p.add_argument("--out-dir", type=Path, help="also write rows.md, rows.json and check.png here")
    args = p.parse_args(argv)
    try:
        test_rows = dict(_named(args.test_rows, "--test-rows"))
        folders = dict(_named(args.studies, "study"))
        unknown_t = [n for n in test_rows if n not in folders]
        if unknown_t:
            raise ValueError(f"--test-rows names {unknown_t[0]!r}, not one of the studies given")
        studies = {
            name: read_study(name, Path(folder), Path(test_rows[name]) if name in test_rows else None)
            for name, folder in folders.items()
        }
        validation = dict(_named(args.validation, "--validation"))
        unknown_v = [n for n in validation if n not in studies]
        if unknown_v:
            raise ValueError(f"--validation names {unknown_v[0]!r}, not one of the studies given")
        checks = [
            check(
                s,
                args.level,
                args.draws,
                ExampleResult.read_jsonl(Path(validation[n])) if n in validation else (),
            )
            for n, s in studies.items()
        ]
        for name, members in _named(args.pool, "--pool"):
            unknown = [m for m in members.split(",") if m not in studies]
            if unknown:
                raise ValueError(
                    f"--pool {name} names {unknown[0]!r}, not one of the studies given: name it as NAME=DIR first"
                )
            checks.append(pooled(name, [studies[m] for m in members.split(",")], args.level))
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = table(checks)
    print(text, end="")
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "rows.md").write_text(text)
        (args.out_dir / "rows.json").write_text(json.dumps([c.to_dict() for c in checks], indent=1) + "\n")
        plot(checks, args.out_dir / "check.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
