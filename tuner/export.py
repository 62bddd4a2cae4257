"""Export schedules from a finished study or from an MLflow run, and register them in MLflow.

    python -m tuner.export --study-name NAME --storage URL [--max-accuracy-loss 2] [--out DIR]
    python -m tuner.export --mlflow-run RUN_ID --out s.json [--tracking-uri URI]
    python -m tuner.export --study-name NAME --storage URL --register MODEL [--alias champion] [--tracking-uri URI]
    python -m tuner.export --mlflow-run RUN_ID --register MODEL [--alias champion] [--tracking-uri URI]

The first re-exports the Pareto front, ``recommended.json`` and the plots from any Optuna storage
(same pick rule as tuner.search: the fastest trial within the loss budget); the second downloads the
``schedule.json`` a trial's MLflow run holds and writes it to ``--out``. ``--register`` makes the
recommended schedule (or the run's) a new version of registered model MODEL, with its metrics and
provenance as tags (:mod:`tuner.tracking.registry`); ``--alias`` also points that alias at it. Load it with
``Schedule.from_mlflow("models:/MODEL@champion")``.

It only reads what exists: a missing SQLite file or MLflow store is an error, never created.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.interrupts import interrupts_end_the_start

with interrupts_end_the_start(__name__):  # Ctrl-C while torch loads: one line
    import optuna

    from lazyllm.cli import cli_main
    from lazyllm.schedule import Schedule
    from tuner.evaluation.losses import Budget
    from tuner.orchestration.preflight import check_budget, check_tracking
    from tuner.redact import redact_text, redact_url
    from tuner.report.files import write_outcome
    from tuner.stages.outcome import StudyOutcome
    from tuner.study.identity import StudyIdentity
    from tuner.study.settings import SearchSettings, add_flags
    from tuner.study.storage import sqlite_path


def load_existing_study(name: str, storage: str) -> optuna.Study:
    """Load study ``name``; a missing SQLite file, an empty database or an unknown name is an error."""
    file = sqlite_path(storage)
    if storage.startswith("sqlite:") and (file is None or not file.is_file()):
        raise ValueError(f"no study storage at {redact_url(storage)} (file not found); check --storage")
    if file is None:  # a server database: do not let Optuna create its tables in it
        import sqlalchemy

        try:
            engine = sqlalchemy.create_engine(storage)
            has_studies = sqlalchemy.inspect(engine).has_table("studies")
            engine.dispose()
        except Exception as exc:  # driver errors of many types: one line
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ValueError(f"cannot open Optuna storage {redact_url(storage)}: {first}") from None
        if not has_studies:
            raise ValueError(f"no Optuna study in {redact_url(storage)}; check --storage")
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise ValueError(f"no study {name!r} in {redact_url(storage)}") from None


def existing_tracking_uri(uri: str | None, fallback: str | None = None) -> str:
    """The MLflow tracking URI to read: the flag, ``$MLFLOW_TRACKING_URI``, ``fallback``, MLflow's
    default; a local store (SQLite file or folder) that does not exist is an error."""
    import mlflow

    chosen = uri or os.environ.get("MLFLOW_TRACKING_URI") or fallback or mlflow.get_tracking_uri()
    if chosen.startswith("databricks"):
        return chosen
    if "://" in chosen and not chosen.startswith(("sqlite:", "file:")):  # a server: it answers, now
        check_tracking(chosen)
        return chosen
    file = sqlite_path(chosen)
    if chosen.startswith("sqlite:"):
        if file is None or not file.is_file():
            raise ValueError(f"no MLflow store at {redact_url(chosen)} (file not found); pass --tracking-uri")
        return chosen
    folder = Path(chosen[len("file://") :] if chosen.startswith("file://") else chosen)
    if not folder.is_dir():
        raise ValueError(f"no MLflow store at {chosen} (folder not found); pass --tracking-uri")
    return chosen


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")  # checked reachable: no minutes of retries

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _from_run(args: argparse.Namespace) -> int:
    from tuner.tracking.registry import register_schedule

    if args.out is None and args.register is None:
        raise ValueError("--mlflow-run needs --out FILE.json or --register NAME")
    uri = existing_tracking_uri(args.tracking_uri)
    schedule = Schedule.from_mlflow(args.mlflow_run, tracking_uri=uri)
    if args.out is not None:
        print(f"wrote {schedule.save(args.out)} ({schedule.model}, {schedule.num_layers} layers)")
    if args.register:
        run_id = args.mlflow_run.removeprefix("runs:/").split("/", 1)[0]
        version = register_schedule(_client(uri), schedule, args.register, run_id=run_id, alias=args.alias)
        _print_version(version, args.alias)
    return 0


def _print_version(version: Any, alias: str | None) -> None:
    where = f"models:/{version.name}@{alias}" if alias else f"models:/{version.name}/{version.version}"
    print(f"registered {version.name} version {version.version}; load it: Schedule.from_mlflow({where!r})")


_EXPORT_HELP = {
    "study_name": "Optuna study to export (with --storage)",
    "storage": "Optuna storage URL of the study, e.g. sqlite:///runs/<study>/study.db",
    "tracking_uri": "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the store the study logged to)",
    "max_accuracy_loss": "loss budget for recommended.json, score points (default: the study's)",
    "register": "register the schedule as a version of MLflow registered model NAME",
}


def _parser() -> argparse.ArgumentParser:
    """The study flags come from the settings fields (:func:`tuner.study.settings.add_flags`), so a flag
    means, parses and validates the same here as in ``tuner.search``."""
    p = argparse.ArgumentParser(prog="python -m tuner.export", description=(__doc__ or "").split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    add_flags(src, SearchSettings, only={"study_name"}, helps=_EXPORT_HELP)
    src.add_argument("--mlflow-run", help="MLflow run id (or runs:/<id>/schedule.json) holding schedule.json")
    add_flags(
        p,
        SearchSettings,
        only={"storage", "tracking_uri", "max_accuracy_loss", "register"},
        helps=_EXPORT_HELP,
    )
    p.add_argument("--out", type=Path, help="output folder (study) or file (MLflow run)")
    p.add_argument("--alias", help="with --register: point this alias (e.g. champion) at the new version")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return cli_main(_parser(), _export, argv, redact=redact_text)


def _export(args: argparse.Namespace) -> int:
    if args.alias and not args.register:
        raise ValueError("--alias needs --register NAME")
    if args.register:
        from tuner.tracking.registry import check_name

        check_name(args.register, args.alias)
    check_budget(args.max_accuracy_loss)
    if args.mlflow_run:
        return _from_run(args)
    if not args.storage:
        raise ValueError("--study-name needs --storage URL")
    study = load_existing_study(args.study_name, args.storage)
    if args.register:  # check the MLflow store before writing anything
        logged = str(study.user_attrs.get("mlflow_tracking_uri") or "")
        uri = existing_tracking_uri(args.tracking_uri, logged if "***" not in logged else None)
    identity = StudyIdentity.of_study(study)
    if identity is None:
        raise ValueError(f"study {args.study_name!r} was not created by tuner.search (it has no identity)")
    stored = Budget.from_settings(identity)
    budget = stored if args.max_accuracy_loss is None else stored.with_task(args.max_accuracy_loss)
    out = args.out or Path("runs") / args.study_name
    outcome = StudyOutcome.from_study(study, budget)
    write_outcome(outcome, out)
    best = outcome.recommended
    state = (
        "none"
        if best is None
        else f"trial {best.number} ({'provisional' if outcome.provisional else 'confirmed'})"
    )
    print(f"{len(outcome.front)} Pareto schedules in {out}/pareto/; recommended: {state}")
    if args.register:
        from tuner.tracking.registry import register_trial

        if best is None:
            raise ValueError(f"no trial within the loss budget {budget.task.budget:g}: nothing to register")
        tags = {"storage": redact_url(args.storage), "max_accuracy_loss": budget.task.budget}
        version = register_trial(
            _client(uri), study, outcome, best, args.register, alias=args.alias, tags=tags
        )
        _print_version(version, args.alias)
    return 0


if __name__ == "__main__":
    sys.exit(main())
