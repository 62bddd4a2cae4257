"""MLflow tracking: one parent run per study, one child run per trial, schedules and plots as artifacts.

Why not optuna-integration's ``MLflowCallback``: it logs through MLflow's fluent API, whose *active
run* is process-global state, so it cannot keep a study-level parent run open across workers and
resumes (it has no ``nested=True`` parent of its own) and it misbehaves with ``n_jobs > 1``. This
module uses ``MlflowClient`` with explicit run ids only: nothing global, safe in any worker.

* **Parent run** (run name = study name, tag ``lazyllm.role=study``): created once. Its id is kept in
  the study's user attrs so every worker and every resume finds it. Two workers starting at once may
  both create one; each then lists the study's parent runs and keeps the oldest, and a worker whose
  own run lost deletes it, so exactly one remains.
* **Child run** per finished trial (run name ``trial-<n>``, tag ``mlflow.parentRunId``): params (the
  trial's search-space parameters, search space, sampler, seed, model, task, truncation), metrics
  (speedup, accuracy loss, score, baseline score, per-dataset scores, FLOP speedup, prompt pairs
  computed), artifact ``schedule.json``; status FINISHED, KILLED for pruned trials (tag
  ``optuna.state=PRUNED``) or FAILED.
* **Where runs go**: ``sqlite:///<study folder>/mlflow.db`` by default (artifacts beside it), or any
  tracking URI; an HTTP server is checked with its ``/health`` endpoint before any trial runs.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

import lazyllm
from lazyllm.schedule import Schedule
from tuner.results import trial_schedule
from tuner.settings import SearchSettings

EXPERIMENT = "lazyllm-tuner"
_PARENT_ATTR = "mlflow_parent_run_id"
_ROLE = "lazyllm.role"
_STUDY = "lazyllm.study"


def default_tracking_uri(settings: SearchSettings) -> str:
    return f"sqlite:///{(settings.study_dir / 'mlflow.db').resolve()}"


def git_commit() -> str | None:
    """The project's git commit, when it runs from a checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def check_reachable(uri: str) -> None:
    """Fail fast (one line) when the tracking URI cannot be used."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as resp:
                if resp.status != 200:
                    raise ValueError(f"MLflow server {uri} answered /health with HTTP {resp.status}")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ValueError(
                f"MLflow tracking server {uri} is not reachable ({reason}); start it or pass another --tracking-uri"
            ) from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri[len("sqlite:///") :]).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cannot create the MLflow store folder {folder}: {exc.strerror}") from None


class Tracker:
    """Logs a study to MLflow through explicit run ids (see the module docstring)."""

    def __init__(self, uri: str, settings: SearchSettings, study: optuna.Study) -> None:
        from mlflow.tracking import MlflowClient

        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
        self.uri = uri
        self.settings = settings
        self.study = study
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment()
        self.parent_id = self._parent()

    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(EXPERIMENT)
        if found is not None:
            return str(found.experiment_id)
        location = None
        if self.uri.startswith("sqlite:///"):
            location = (Path(self.uri[len("sqlite:///") :]).parent / "mlartifacts").resolve().as_uri()
        try:
            return str(self.client.create_experiment(EXPERIMENT, artifact_location=location))
        except MlflowException:  # another worker created it first
            again = self.client.get_experiment_by_name(EXPERIMENT)
            if again is None:
                raise
            return str(again.experiment_id)

    def _study_parents(self) -> list[Any]:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{_ROLE}` = 'study' and tags.`{_STUDY}` = '{self.settings.name}'",
            order_by=["attributes.start_time ASC"],
        )
        return sorted(runs, key=lambda r: (r.info.start_time, r.info.run_id))

    def _parent(self) -> str:
        stored = self.study.user_attrs.get(_PARENT_ATTR)
        if stored:
            return str(stored)
        parents = self._study_parents()
        if not parents:
            tags = {
                _ROLE: "study",
                _STUDY: self.settings.name,
                "model": self.settings.model,
                "task": self.settings.task,
                "lazyllm_version": lazyllm.__version__,
            }
            commit = git_commit()
            if commit:
                tags["git_commit"] = commit
            mine = self.client.create_run(self.experiment_id, run_name=self.settings.name, tags=tags)
            for key, value in sorted(self.settings.study_identity().items()):
                self.client.log_param(mine.info.run_id, key, value)
            for key in ("sampler", "seed", "n_trials", "storage"):
                self.client.log_param(mine.info.run_id, key, getattr(self.settings, key))
            time.sleep(0.2)  # let a concurrent worker's run become visible before deciding
            parents = self._study_parents()
            winner = parents[0].info.run_id
            if winner != mine.info.run_id:
                self.client.delete_run(mine.info.run_id)
        else:
            winner = parents[0].info.run_id
        self.study.set_user_attr(_PARENT_ATTR, winner)
        return str(winner)

    def log_trial(self, trial: FrozenTrial) -> str:
        """A child run for a finished trial; returns its run id."""
        from mlflow.entities import Metric, Param, RunTag

        state = trial.state
        tags = {
            "mlflow.parentRunId": self.parent_id,
            _ROLE: "trial",
            _STUDY: self.settings.name,
            "optuna.trial": str(trial.number),
            "optuna.state": state.name,
            "model": self.settings.model,
            "task": self.settings.task,
        }
        if "stopped_early" in trial.user_attrs:
            tags["stopped_early"] = str(trial.user_attrs["stopped_early"])[:5000]
        run = self.client.create_run(self.experiment_id, run_name=f"trial-{trial.number}", tags=tags)
        run_id = run.info.run_id
        params = {f"space.{k}": v for k, v in trial.params.items()}
        params.update(
            {
                "search_space": self.settings.search_space,
                "sampler": self.settings.sampler,
                "seed": self.settings.seed,
                "model": self.settings.model,
                "task": self.settings.task,
                "max_prompt_tokens": self.settings.max_prompt_tokens,
                "max_new_tokens": self.settings.max_new_tokens,
                "n_examples": self.settings.n_examples,
                "speedup_kind": self.settings.speedup,
            }
        )
        now = int(time.time() * 1000)
        metrics: dict[str, float] = {}
        if trial.values:
            metrics["speedup"], metrics["accuracy_loss"] = float(trial.values[0]), float(trial.values[1])
        attrs = trial.user_attrs
        for key, name in (
            ("score", "score"),
            ("baseline_score", "baseline_score"),
            ("flop_speedup", "flop_speedup"),
            ("measured_ttft_speedup", "measured_ttft_speedup"),
            ("total_speedup", "total_speedup"),
            ("prompt_computed_pct", "prompt_computed_pct"),
            ("wall_time_s", "wall_time_s"),
        ):
            if attrs.get(key) is not None:
                metrics[name] = float(attrs[key])
        for dataset, score in (attrs.get("dataset_scores") or {}).items():
            metrics[f"score.{dataset}"] = float(score)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
            params=[Param(k, str(v)) for k, v in params.items()],
            tags=[RunTag("lazyllm_version", lazyllm.__version__)],
        )
        if "percentiles" in attrs:
            schedule = (
                trial_schedule(self.study, trial)  # with provenance
                if trial.values
                else Schedule(self.settings.model, tuple(attrs["percentiles"]))
            )
            with tempfile.TemporaryDirectory() as tmp:
                self.client.log_artifact(run_id, str(schedule.save(Path(tmp) / "schedule.json")))
        status = {TrialState.COMPLETE: "FINISHED", TrialState.PRUNED: "KILLED"}.get(state, "FAILED")
        self.client.set_terminated(run_id, status=status)
        return run_id

    def callback(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Optuna callback: log each finished trial (not the surplus ones, which never ran)."""
        if not trial.user_attrs.get("surplus"):
            self.log_trial(trial)

    def log_study(self, files: list[Path], metrics: dict[str, float]) -> None:
        """Attach the study's exported files and headline metrics to the parent run."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        if metrics:
            self.client.log_batch(
                self.parent_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()]
            )
        for path in files:
            if path.is_dir():
                self.client.log_artifacts(self.parent_id, str(path), artifact_path=path.name)
            elif path.exists():
                self.client.log_artifact(self.parent_id, str(path))

    def child_runs(self) -> list[Any]:
        return list(
            self.client.search_runs(
                [self.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_id}'"
            )
        )


def wanted(settings: SearchSettings) -> bool:
    """Tracking is on unless explicitly disabled with ``--tracking-uri none``."""
    return (settings.tracking_uri or "").lower() != "none"
