"""The MLflow Model Registry for promoted schedules.

:func:`register_schedule` logs a schedule as an MLflow model (:mod:`tuner.tracking.serving`) into the run it
came from (artifact ``schedule-model``) and registers it as a new version of a registered model:

* version tags: the schedule's metrics (``metric.speedup``, ``metric.accuracy_loss``, ...) and its
  provenance (``study``, ``trial``, ``model``, ``task``, ``split``, ``search_space``,
  ``speedup_kind``, ``lazyllm_version``, ``source_run``), URLs with their passwords masked;
* an alias (e.g. ``champion``) only when asked for, so promoting is a separate, explicit step.

``Schedule.from_mlflow("models:/NAME@champion")`` or ``"models:/NAME/3"`` loads it back, and
``mlflow models serve -m models:/NAME@champion --env-manager local`` serves it.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import optuna

import lazyllm
from lazyllm.schedule import Schedule
from tuner.redact import redact_text
from tuner.stages.outcome import StudyOutcome
from tuner.study.records import TrialRecord

MODEL_ARTIFACT = "schedule-model"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_ALIAS = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,99}$")


def check_name(name: str, alias: str | None = None) -> None:
    """One-line errors for a registered-model name or alias MLflow would refuse."""
    if not _NAME.match(name):
        raise ValueError(f"registered model name {name!r}: use letters, digits, '_', '-' and '.'")
    if alias is not None and (not _ALIAS.match(alias) or re.fullmatch(r"[vV]\d+|latest", alias)):
        raise ValueError(f"alias {alias!r}: use letters, digits, '_' and '-' (not 'latest' or v<number>)")


def version_tags(schedule: Schedule, extra: dict[str, Any] | None = None) -> dict[str, str]:
    """Tags for a model version: the schedule's metrics and provenance (every value redacted)."""
    meta = schedule.metadata
    tags: dict[str, Any] = {
        "model": schedule.model,
        "num_layers": schedule.num_layers,
        "revival": str(schedule.revival),
        "scoring": str(schedule.scoring),
    }
    for key in ("study", "trial", "task", "split", "search_space", "lazyllm_version", "source"):
        if meta.get(key) is not None:
            tags[key] = meta[key]
    metrics = meta.get("metrics") or {}
    for key, value in metrics.items():
        if key == "speedup_kind":
            tags["speedup_kind"] = value
        elif value is not None:
            tags[f"metric.{key}"] = value
    budget = (meta.get("settings") or {}).get("max_accuracy_loss")
    if budget is not None:
        tags["max_accuracy_loss"] = budget
    tags.update(extra or {})
    tags.setdefault("lazyllm_version", lazyllm.__version__)
    return {k: redact_text(str(v))[:5000] for k, v in tags.items()}


def register_schedule(
    client: Any,
    schedule: Schedule,
    name: str,
    *,
    run_id: str,
    alias: str | None = None,
    base_model: str | None = None,
    tags: dict[str, Any] | None = None,
) -> Any:
    """Log ``schedule`` as an MLflow model into run ``run_id`` and register it; returns the version."""
    from mlflow.exceptions import MlflowException

    from tuner.tracking.serving import save_model

    check_name(name, alias)
    with tempfile.TemporaryDirectory(prefix="lazyllm-register-") as tmp:
        folder = save_model(schedule, Path(tmp) / MODEL_ARTIFACT, base_model=base_model)
        client.log_artifacts(run_id, str(folder), artifact_path=MODEL_ARTIFACT)
    try:
        client.create_registered_model(
            name, description="LazyLLM pruning schedules tuned by lazyllm-tuner (pyfunc: generate text)"
        )
    except MlflowException as exc:
        if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
            raise
    source = f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{MODEL_ARTIFACT}"
    all_tags = version_tags(schedule, {"source_run": run_id, **(tags or {})})
    meta = schedule.metadata
    description = (
        f"Schedule for {schedule.model} from study {meta.get('study', '?')}, trial {meta.get('trial', '?')}"
    )
    version = client.create_model_version(name, source, run_id=run_id, tags=all_tags, description=description)
    if alias:
        client.set_registered_model_alias(name, alias, version.version)
    return version


def register_trial(
    client: Any, study: optuna.Study, outcome: StudyOutcome, record: TrialRecord, name: str, *,
    alias: str | None = None, tags: dict[str, Any] | None = None,
) -> Any:  # fmt: skip
    """Register ``record`` of ``study`` (logged by :class:`tuner.tracking.runs.Tracker`) as ``name``."""
    trial = record
    parent = study.user_attrs.get("mlflow_parent_run_id")
    runs = []
    if parent:
        runs = client.search_runs(
            [client.get_run(str(parent)).info.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.`optuna.trial` = '{trial.number}'",
            max_results=1,
        )
    if not runs:
        raise ValueError(
            f"trial {trial.number} of study {study.study_name!r} has no MLflow run in this tracking store "
            "(was tracking off?); pass --tracking-uri of the store the study logged to"
        )
    return register_schedule(
        client, outcome.schedule_of(record), name, run_id=runs[0].info.run_id, alias=alias, tags=tags
    )
