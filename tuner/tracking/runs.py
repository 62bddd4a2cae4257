"""MLflow tracking: one parent run per study, one child run per trial, schedules and plots as artifacts.

Why not optuna-integration's ``MLflowCallback``: it logs through MLflow's fluent API, whose *active
run* is process-global state, so it cannot keep a study-level parent run open across workers and
resumes (it has no ``nested=True`` parent of its own) and it misbehaves with ``n_jobs > 1``. This
module uses ``MlflowClient`` with explicit run ids only, safe in any worker.

* **Parent run** (run name = study name, tag ``lazyllm.role=study``): created once. Its id is kept in
  the study's user attrs so every worker and every resume finds it. Two workers starting at once may
  both create one; each then lists the study's parent runs and keeps the oldest, and a worker whose
  own run lost deletes it, so exactly one remains. Params: the study identity (the objective's kind
  as ``speedup_kind``), sampler, seed and the storage URL with its password masked.
* **Lifecycle of the parent**: RUNNING while a process works on the study (a resume reopens it);
  :meth:`Tracker.end_study` ends it FINISHED once every stage ran, with ``lazyllm.end_reason`` saying
  why the trials stopped (``done: 60 of 60 trials``, ``timeout: 41 of 60 trials``);
  :func:`end_open_runs` ends it KILLED on Ctrl-C or a signal and FAILED on an error. Its metrics count trials
  (``finished_trials`` = COMPLETE + PRUNED, what ``n_trials`` counts; ``complete_trials``,
  ``pruned_trials``, ``failed_trials``, the target ``n_trials``) and name the recommendation
  (``recommended.speedup``, ``recommended.accuracy_loss``, ``recommended.trial``; for a pick of the
  pooled calibration also ``recommended.predicted_task_loss_upper``, its task-loss bound at
  ``--confidence``, and ``recommended.certified_at_confidence``, 1 when that bound is within budget).
* **Child run** per trial that ran (run name ``trial-<n>``, tag ``mlflow.parentRunId``), with the
  trial's real start and end time: params (the trial's search-space parameters, search space,
  sampler, seed, model, task, truncation, ``speedup_kind``), metrics (``speedup``,
  ``accuracy_loss``, score, baseline score, per-dataset scores, FLOP speedup, prompt pairs computed,
  wall time), artifact ``schedule.json``; status FINISHED (a trial stopped early by design too, with
  tag ``optuna.state=PRUNED``) or FAILED. A proposal refused as a duplicate never ran and gets no run
  (nor does a surplus trial). Failed trials that no callback saw (an
  exception that ended the process, a worker whose heartbeat went stale) get their FAILED run when
  a tracker opens or ends the study.
* **Names**: one per quantity everywhere (Optuna's metric names, MLflow metrics, ``pareto.json``,
  the plots): ``speedup`` (measured TTFT or FLOP model, per ``speedup_kind``) and ``accuracy_loss``.
* **The experiment** ``lazyllm-tuner`` is tagged ``mlflow.experimentKind=custom_model_development``
  (also when an older version created it), so MLflow's UI opens it on the runs table, not on the
  GenAI overview of traces.
* **Where runs go**: ``sqlite:///<study folder>/mlflow.db`` by default (artifacts beside it), or any
  tracking URI; an HTTP server is checked with its ``/health`` endpoint before any trial runs. A
  password in a storage or tracking URL never reaches a param, a tag or a study attr
  (:func:`tuner.redact.redact_url`).
* **Ctrl-C**: a write that has begun finishes first (:func:`tuner.interrupts.held_interrupts`), so an
  interrupt never leaves the SQLite store locked by a half-done transaction of its own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

import lazyllm
from tuner.evaluation.losses import Budget
from tuner.interrupts import whole
from tuner.redact import redact_text, redact_url
from tuner.stages.outcome import StudyOutcome
from tuner.study.records import TrialRecord
from tuner.study.settings import SearchSettings
from tuner.study.storage import sqlite_path
from tuner.study.workers import never_ran

EXPERIMENT = "lazyllm-tuner"
# MLflow's UI opens an experiment on the view its kind names; without the tag it shows the GenAI
# overview (traces), with it the runs table where a study's parent and trials are
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
_PARENT_ATTR = "mlflow_parent_run_id"
_ROLE = "lazyllm.role"
_STUDY = "lazyllm.study"
_REASON = "lazyllm.end_reason"
_STATUS = {
    TrialState.COMPLETE: "FINISHED",
    TrialState.PRUNED: "FINISHED",
}  # PRUNED: stopped early by design, tagged


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


_SERVER_SCHEMES = ("postgresql", "mysql", "mssql", "oracle")


def check_reachable(uri: str, *, timeout_s: float = 5.0) -> None:
    """Fail fast (one line, password masked, no retries) when the tracking URI cannot be used. Writes
    nothing: a SQLite store's folder is made when the store is (:func:`tuner.study.storage.prepare_mlflow_store`).

    * ``http(s)://[user:password@]host[:port]``: ``/health`` answers 200 within ``timeout_s``; the
      userinfo is sent as HTTP basic auth (what MLflow's client does with it), never as part of the host;
    * ``postgresql://``, ``mysql://``, ...: the driver is installed and the database answers;
    * ``sqlite:///FILE``: FILE is a SQLite database or nothing yet, in a folder that can be made.
    """
    from tuner.study.storage import check_database, check_tracking_store

    shown = redact_url(uri)
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme in ("http", "https"):
        _check_http(uri, shown, timeout_s)
    elif scheme.split("+", 1)[0] in _SERVER_SCHEMES:
        check_database(uri, "MLflow tracking store", "--tracking-uri", timeout_s=max(1, int(timeout_s)))
    elif uri.startswith("sqlite:"):
        check_tracking_store(uri, folder=True)


def _check_http(uri: str, shown: str, timeout_s: float) -> None:
    import base64
    from urllib.parse import unquote, urlsplit, urlunsplit

    fix = "start it or pass another --tracking-uri"
    try:
        parts = urlsplit(uri)
        host, port = parts.hostname, parts.port  # a bad port raises ValueError here
    except ValueError:
        raise ValueError(
            f"tracking URI {shown} is not a valid URL (host or port; a '/', '?' or '#' in the password "
            "must be percent-encoded, e.g. %2F); pass another --tracking-uri"
        ) from None
    if not host:
        raise ValueError(
            f"tracking URI {shown} names no host; pass e.g. --tracking-uri http://127.0.0.1:5000"
        )
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")
    health = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/health", "", ""))
    request = urllib.request.Request(health)
    if parts.username is not None or parts.password is not None:
        user_pass = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(user_pass.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        reason = redact_text(str(getattr(exc, "reason", exc)))
        raise ValueError(f"MLflow tracking server {shown} is not reachable ({reason}); {fix}") from None
    if status in (401, 403):
        raise ValueError(
            f"MLflow tracking server {shown} refused the credentials (HTTP {status}); check the user and "
            "password in --tracking-uri"
        )
    if status != 200:
        raise ValueError(f"MLflow tracking server {shown} answered /health with HTTP {status}; {fix}")


def _ms(when: datetime | None) -> int | None:
    return None if when is None else int(when.timestamp() * 1000)


def trial_counts(study: optuna.Study) -> dict[str, int]:
    """COMPLETE, PRUNED and FAILED trials (surplus trials and refused duplicates, which never ran,
    are not counted)."""
    trials = study.get_trials(deepcopy=False)
    complete = sum(t.state == TrialState.COMPLETE for t in trials)
    pruned = sum(t.state == TrialState.PRUNED and not never_ran(t) for t in trials)
    failed = sum(t.state == TrialState.FAIL and not never_ran(t) for t in trials)
    return {
        "finished_trials": complete + pruned,
        "complete_trials": complete,
        "pruned_trials": pruned,
        "failed_trials": failed,
    }


_OPEN: weakref.WeakSet[Tracker] = weakref.WeakSet()


def end_open_runs(status: str, reason: str) -> None:
    """End the parent run of every tracker this process opened and did not end (Ctrl-C: ``KILLED``,
    an error: ``FAILED``), after giving failed trials their runs. Never raises: it runs on the way out."""
    for tracker in list(_OPEN):
        try:
            tracker.sync_failed()
            tracker.end(status, reason)
        except Exception as exc:  # the store may be the thing that broke; say so and go on
            message = f"MLflow: could not end parent run {tracker.parent_id}: {redact_text(str(exc))[:200]}"
            print(message, file=sys.stderr)


class Tracker:
    """Logs a study to MLflow through explicit run ids (see the module docstring)."""

    @whole
    def __init__(self, uri: str, settings: SearchSettings, study: optuna.Study, budget: Budget) -> None:
        from mlflow.tracking import MlflowClient

        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
        self.uri = uri
        self.settings = settings
        self.budget = budget
        self.study = study
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment()
        self.parent_id = self._parent()
        self.reopen()
        self.sync_failed()

    # --- the parent run ---------------------------------------------------------------------------
    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(EXPERIMENT)
        if found is not None:
            for key, value in EXPERIMENT_KIND.items():  # an experiment an older version created
                if found.tags.get(key) != value:
                    self.client.set_experiment_tag(found.experiment_id, key, value)
            return str(found.experiment_id)
        location = None
        if (file := sqlite_path(self.uri)) is not None:
            location = (file.parent / "mlartifacts").resolve().as_uri()
        try:
            return str(
                self.client.create_experiment(EXPERIMENT, artifact_location=location, tags=EXPERIMENT_KIND)
            )
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

    def _parent_params(self) -> dict[str, Any]:
        params = {
            ("speedup_kind" if k == "speedup" else k): v for k, v in self.settings.study_identity().items()
        }
        params.update(
            sampler=self.settings.sampler,
            seed=self.settings.seed,
            calibration_exponent=self.settings.calibration_exponent,
            storage=redact_url(self.settings.storage_url),
        )
        prompts = self.settings.prompts_file
        if prompts is not None:  # the file's name, row count and fingerprint; never its content
            params.update(
                prompts_file=prompts.name,
                prompts_rows=len(prompts.rows),
                prompts_fingerprint=prompts.fingerprint,
            )
        return params

    def _parent(self) -> str:
        from mlflow.entities import Param

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
            params = [Param(k, str(v)) for k, v in sorted(self._parent_params().items())]
            self.client.log_batch(mine.info.run_id, params=params)
            time.sleep(0.2)  # let a concurrent worker's run become visible before deciding
            parents = self._study_parents()
            winner = parents[0].info.run_id
            if winner != mine.info.run_id:
                self.client.delete_run(mine.info.run_id)
        else:
            winner = parents[0].info.run_id
        self.study.set_user_attr(_PARENT_ATTR, winner)
        # where the runs are, for whoever opens the study in optuna-dashboard or the optuna CLI
        self.study.set_user_attr("mlflow_tracking_uri", redact_url(self.uri))
        return str(winner)

    def reopen(self) -> None:
        """Mark the parent RUNNING (a resume of an ended study) and log the trial target and counts."""
        if self.client.get_run(self.parent_id).info.status != "RUNNING":
            self.client.update_run(self.parent_id, status="RUNNING")
        self.client.set_tag(self.parent_id, _REASON, "running")
        self._log_counts()
        _OPEN.add(self)

    @whole
    def end(self, status: str, reason: str) -> None:
        """End the parent run with ``status`` (FINISHED, KILLED or FAILED) and say why in a tag."""
        self._log_counts()
        self.client.set_tag(self.parent_id, _REASON, redact_text(reason)[:5000])
        self.client.set_terminated(self.parent_id, status=status)
        _OPEN.discard(self)

    def _log_counts(self) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = {**trial_counts(self.study), "n_trials": self.settings.n_trials}
        self.client.log_batch(
            self.parent_id, metrics=[Metric(k, float(v), now, 0) for k, v in values.items()]
        )

    @whole
    def end_study(self, outcome: StudyOutcome, files: list[Path], stopped: str = "done") -> str:
        """Attach the study's result files (written once, from ``outcome``) to the parent, log the
        recommendation and end the run FINISHED: every stage ran. Returns the status.

        ``stopped`` is why the trials stopped (:func:`tuner.study.workers.run_trials`: ``done``,
        ``timeout`` or ``exhausted``); the end-reason tag says it with the trial count, e.g.
        ``timeout: 41 of 60 trials`` (rerunning resumes the rest). KILLED is kept for Ctrl-C and
        signals, FAILED for errors (:func:`end_open_runs`). With ``settings.register`` the recommended
        schedule is also registered (:mod:`tuner.tracking.registry`).
        """
        from mlflow.entities import Metric

        self.sync_failed()
        now = int(time.time() * 1000)
        best = outcome.recommended
        if best is not None:
            headline = {
                "recommended.speedup": best.values[0],
                "recommended.accuracy_loss": best.values[1],
                "recommended.trial": best.number,
                "recommended.provisional": float(outcome.provisional),
            }
            conf = outcome.confirmation
            upper = None if conf is None else conf.recommended_upper_at_confidence()
            if conf is not None and upper is not None:
                # the pooled calibration's bound at --confidence: certified there, or only at the decision level
                headline["recommended.predicted_task_loss_upper"] = upper
                headline["recommended.certified_at_confidence"] = float(upper <= conf.budget)
            seen = None if conf is None or conf.fresh is None else conf.fresh.of(best.number)
            if seen is not None:  # its KL on the fresh prompts of the fresh-drift check
                headline["recommended.fresh_kl"] = seen
            self.client.log_batch(
                self.parent_id, metrics=[Metric(k, float(v), now, 0) for k, v in headline.items()]
            )
            self.client.set_tag(
                self.parent_id, "lazyllm.recommended", "provisional" if outcome.provisional else "confirmed"
            )
        self.client.set_tag(self.parent_id, "lazyllm.accuracy_loss_unit", outcome.search_loss.unit)
        self.client.set_tag(self.parent_id, "lazyllm.budget_kind", outcome.budget_kind)  # gold or agreement
        self.client.set_tag(self.parent_id, "lazyllm.budget", outcome.budget_line()[:5000])
        power = outcome.power
        if power is not None:  # what the validation prompts certify, and how many would certify the budget
            self.client.set_tag(self.parent_id, "lazyllm.power", power[:5000])
        for note in outcome.notes:
            self.client.set_tag(self.parent_id, "lazyllm.note", note[:5000])
        self._log_prior(outcome, now)
        fresh = None if outcome.confirmation is None else outcome.confirmation.fresh
        if fresh is not None:
            self.client.set_tag(self.parent_id, "lazyllm.fresh_check", fresh.prompts[:500])
        if outcome.decision:
            self.client.set_tag(self.parent_id, "lazyllm.decision", outcome.decision[:5000])
        for path in files:
            if path.is_dir():
                self.client.log_artifacts(self.parent_id, str(path), artifact_path=path.name)
            elif path.exists():
                self.client.log_artifact(self.parent_id, str(path))
        if self.settings.register and best is not None:
            from tuner.tracking.registry import register_trial

            version = register_trial(self.client, self.study, outcome, best, self.settings.register)
            print(f"MLflow: registered {self.settings.register} version {version.version}")
        finished = trial_counts(self.study)["finished_trials"]
        self.end("FINISHED", f"{stopped}: {finished} of {self.settings.n_trials} trials")
        return "FINISHED"

    def _log_prior(self, outcome: StudyOutcome, now: int) -> None:
        """The slope prior the study read (tag ``lazyllm.slope_prior``: its id or ``none``; the file as
        artifact ``slope_prior/``) and, where the calibration was checked against it, the floor's numbers."""
        from mlflow.entities import Metric

        prior = self.settings.prior
        self.client.set_tag(self.parent_id, "lazyllm.slope_prior", "none" if prior is None else prior.id)
        if prior is not None:
            with tempfile.TemporaryDirectory() as tmp:
                path = prior.save(Path(tmp) / f"{prior.model}.json")
                self.client.log_artifact(self.parent_id, str(path), artifact_path="slope_prior")
        conf = outcome.confirmation
        floor = None if conf is None or conf.calibration is None else conf.calibration.floor
        if floor is None:
            return
        values = {
            "calibration.floor_applied": float(floor.applied),
            "calibration.floor_binds": float(floor.binds),
            "calibration.prior_slope": floor.prior_slope,
            "calibration.prior_slope_upper": floor.prior_upper,
            "calibration.own_slope": floor.own_slope,
            "calibration.own_slope_upper": floor.own_upper,
        }
        if floor.examples_needed is not None:
            values["calibration.examples_needed"] = float(floor.examples_needed)
        if floor.baseline_score is not None:
            values["calibration.baseline_score"] = floor.baseline_score
        if floor.baseline_upper_confidence is not None:
            values["calibration.baseline_score_upper"] = floor.baseline_upper_confidence
            values["calibration.decided_at_score_bound"] = float(floor.decided_at_bound)
        self.client.log_batch(
            self.parent_id, metrics=[Metric(k, float(v), now, 0) for k, v in values.items()]
        )

    # --- child runs -------------------------------------------------------------------------------
    def trial_run_id(self, number: int) -> str | None:
        """The run id of trial ``number`` of this study, if it has one."""
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_id}' and tags.`optuna.trial` = '{number}'",
            order_by=["attributes.start_time ASC"],
            max_results=1,
        )
        return str(runs[0].info.run_id) if runs else None

    def log_trial(self, trial: FrozenTrial) -> str:
        """A child run for a finished or failed trial, with its real start and end; returns its run id."""
        from mlflow.entities import Metric, Param, RunTag

        state = trial.state
        record = TrialRecord.from_trial(trial, self.settings.model)
        tags = {
            "mlflow.parentRunId": self.parent_id,
            _ROLE: "trial",
            _STUDY: self.settings.name,
            "optuna.trial": str(trial.number),
            "optuna.state": state.name,
            "model": self.settings.model,
            "task": self.settings.task,
        }
        if record is not None and record.stopped:
            tags["stopped_early"] = record.stopped[:5000]
        if "fail_reason" in trial.system_attrs:
            tags["optuna.fail_reason"] = redact_text(str(trial.system_attrs["fail_reason"]))[:5000]
        if "failed_trial" in trial.system_attrs:  # a retry of a trial whose worker died
            tags["optuna.retry_of"] = str(trial.system_attrs["failed_trial"])
        start = _ms(trial.datetime_start) or int(time.time() * 1000)
        end = _ms(trial.datetime_complete) or int(time.time() * 1000)
        run = self.client.create_run(
            self.experiment_id, start_time=start, run_name=f"trial-{trial.number}", tags=tags
        )
        run_id = run.info.run_id
        params = {f"space.{k}": v for k, v in trial.params.items()}
        params.update(
            {
                "search_space": self.settings.search_space,
                "sampler": self.settings.sampler,
                "seed": self.settings.seed,
                "model": self.settings.model,
                "dtype": self.settings.dtype,
                "task": self.settings.task,
                "max_prompt_tokens": self.settings.max_prompt_tokens,
                "max_new_tokens": self.settings.max_new_tokens,
                "n_examples": self.settings.n_examples,
                "speedup_kind": self.settings.speedup,
            }
        )
        metrics = record.flat_metrics() if record is not None else {}
        params["accuracy_loss_unit"] = self.budget.search.unit
        if record is not None:
            params["schedule.revival"] = str(record.schedule.revival)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, end, 0) for k, v in metrics.items()],
            params=[Param(k, str(v)) for k, v in params.items()],
            tags=[RunTag("lazyllm_version", lazyllm.__version__)],
        )
        if record is not None:
            schedule = StudyOutcome.from_study(self.study, with_records=False).schedule_of(
                record
            )  # provenance
            with tempfile.TemporaryDirectory() as tmp:
                self.client.log_artifact(run_id, str(schedule.save(Path(tmp) / "schedule.json")))
        self.client.set_terminated(run_id, status=_STATUS.get(state, "FAILED"), end_time=end)
        return run_id

    @whole
    def callback(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Optuna callback: log each trial that ran (not surplus trials or refused duplicates)."""
        if not never_ran(trial):
            self.log_trial(trial)

    @whole
    def sync_failed(self) -> list[str]:
        """FAILED runs for failed trials that have none yet (no callback saw them); returns their ids."""
        failed = [
            t for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if not never_ran(t)
        ]
        if not failed:
            return []
        logged = {
            int(r.data.tags["optuna.trial"]) for r in self.child_runs() if "optuna.trial" in r.data.tags
        }
        return [self.log_trial(t) for t in failed if t.number not in logged]

    def child_runs(self) -> list[Any]:
        return list(
            self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_id}'",
                max_results=50000,
            )
        )


def wanted(settings: SearchSettings) -> bool:
    """Tracking is on unless explicitly disabled with ``--tracking-uri none``."""
    return (settings.tracking_uri or "").lower() != "none"
