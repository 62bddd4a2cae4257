"""Export schedules from a finished study or from an MLflow run.

    python -m tuner.export --study-name NAME --storage URL [--max-accuracy-loss 2] [--out DIR]
    python -m tuner.export --mlflow-run RUN_ID --out s.json [--tracking-uri URI]

The first re-exports the Pareto front, ``recommended.json`` and the plots from any Optuna storage
(same pick rule as tuner.search: the fastest trial within the loss budget); the second downloads the
``schedule.json`` a trial's MLflow run holds and writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import optuna

from lazyllm.schedule import Schedule
from tuner.results import export_study


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.export", description=(__doc__ or "").split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--study-name", help="Optuna study to export (with --storage)")
    src.add_argument("--mlflow-run", help="MLflow run id (or runs:/<id>/schedule.json) holding schedule.json")
    p.add_argument("--storage", help="Optuna storage URL of the study, e.g. sqlite:///runs/<study>/study.db")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI)")
    p.add_argument(
        "--max-accuracy-loss", type=float, help="loss budget for recommended.json (default: the study's)"
    )
    p.add_argument("--out", type=Path, help="output folder (study) or file (MLflow run)")
    args = p.parse_args(argv)
    try:
        if args.mlflow_run:
            if args.out is None:
                raise ValueError("--mlflow-run needs --out FILE.json")
            schedule = Schedule.from_mlflow(args.mlflow_run, tracking_uri=args.tracking_uri)
            print(f"wrote {schedule.save(args.out)} ({schedule.model}, {schedule.num_layers} layers)")
            return 0
        if not args.storage:
            raise ValueError("--study-name needs --storage URL")
        try:
            study = optuna.load_study(study_name=args.study_name, storage=args.storage)
        except KeyError:
            raise ValueError(f"no study {args.study_name!r} in {args.storage}") from None
        budget = args.max_accuracy_loss
        if budget is None:
            budget = float(study.user_attrs.get("identity", {}).get("max_accuracy_loss", 0.0))
        out = args.out or Path("runs") / args.study_name
        exported = export_study(study, out, budget)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{len(exported['front'])} Pareto schedules in {out}/pareto/; recommended: {exported['recommended']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
