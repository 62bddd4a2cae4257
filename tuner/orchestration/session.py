"""One study run: check everything cheap, open the study and its tracking, run trials in one or many
workers, export the front, run the held-out check.

Order matters (nothing is written before every check that needs no model has passed): settings are
validated when built, then the output folder, the search space, the LongBench data folder and the
tracking server are checked; only then is the model loaded, the study created and the baseline
computed. ``tuner.search`` parses flags and calls :func:`run_study`; local worker processes
(``--n-workers``) call :func:`run_worker`.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from tqdm.auto import tqdm

from lazyllm.models import load_model
from tuner.data.prompts import heldout_note
from tuner.evaluation.losses import Budget
from tuner.evaluation.runner import Evaluator
from tuner.orchestration.preflight import check_search
from tuner.redact import redact_url
from tuner.report.console import summary_lines
from tuner.report.decision import explain, power_line, timing_sentence
from tuner.report.files import write_outcome
from tuner.stages.confirm import confirm
from tuner.stages.decision import TrialTiming, decide, recommendation_certainty
from tuner.stages.front import non_dominated, study_records
from tuner.stages.heldout import heldout_check
from tuner.stages.outcome import StudyOutcome
from tuner.stages.pilot import PILOT_ATTR, PilotResult, run_pilot, stored_pilot, wants_pilot
from tuner.stages.target import at_target, store_judged
from tuner.stages.trial import TrialRunner, fidelity_of
from tuner.study.records import TrialRecord, complete_trial_count
from tuner.study.settings import SearchSettings
from tuner.study.spaces import load_space
from tuner.study.storage import (
    finished_trials,
    make_storage,
    open_study,
    prepare_mlflow_store,
    study_lock,
    warm_start,
)
from tuner.study.workers import DUPLICATE_ATTR, run_trials, worker_device, worker_threads
from tuner.tracking.runs import Tracker, default_tracking_uri, wanted
from tuner.tracking.ui import ui_lines


class Progress:
    """Optuna callback: trial k/N, its values, the current Pareto front and the time left."""

    def __init__(self, target: int, timeout: float | None, unit: str) -> None:
        self.target = target
        self.unit = unit
        self.timeout = timeout
        self.start = time.monotonic()
        self.durations: list[float] = []

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        done = finished_trials(study)
        record = TrialRecord.from_trial(trial)
        if trial.duration is not None and record is not None:  # refused proposals cost nothing
            self.durations.append(trial.duration.total_seconds())
        per = statistics.median(self.durations) if self.durations else 0.0
        left = max(0, self.target - done) * per
        if self.timeout is not None:
            left = min(left, max(0.0, self.timeout - (time.monotonic() - self.start)))
        if trial.system_attrs.get(DUPLICATE_ATTR) is not None:
            what = f"refused: the schedule of trial {trial.system_attrs[DUPLICATE_ATTR]} (a fresh draw is queued)"
        elif record is not None and record.complete:
            what = f"speedup {record.values[0]:.2f}x, loss {record.values[1]:.4g} {self.unit}"
        elif record is not None:
            what = f"stopped early: {record.stopped}"
        elif trial.user_attrs.get("interrupted"):
            what = "interrupted (queued again: the rerun evaluates it)"
        else:
            what = trial.state.name.lower()
        front = ", ".join(
            f"#{r.number} {r.values[0]:.2f}x/{r.values[1]:.3g}"
            for r in non_dominated(study_records(study))[:6]
        )
        tqdm.write(
            f"[trial {done}/{self.target}] #{trial.number} {what} | front: {front} | ~{left / 60:.1f} min left"
        )
        if len(self.durations) == 1 and record is not None:  # known at minute 2, not minute 15
            timing = TrialTiming(1, self.target, self.durations[0], self.timeout)
            tqdm.write(f"  time: {timing_sentence(timing)}")


def preflight(settings: SearchSettings) -> None:
    """Every check that needs no model and writes nothing (:func:`tuner.orchestration.preflight.check_search`)."""
    check_search(settings)


def check_output(settings: SearchSettings) -> None:
    folder = settings.study_dir
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # can we create a file there? (removed on close)
            pass
    except OSError as exc:
        raise ValueError(
            f"output folder {folder} is not writable ({exc.strerror}); pass --output DIR"
        ) from None


@dataclass
class Session:
    """What one process needs to run trials: model, study, tracker, evaluator and the trial runner."""

    settings: SearchSettings
    model: Any
    tokenizer: Any
    study: optuna.Study
    tracker: Tracker | None
    evaluator: Evaluator
    runner: TrialRunner
    tracking_uri: str
    storage: optuna.storages.RDBStorage
    pilot: PilotResult | None = None  # what set the cap of a model with no prior (tuner.stages.pilot)

    def close(self) -> None:
        """Return the storage's database connections now, not at garbage collection: a PostgreSQL
        server shared by many workers has a fixed number of connection slots."""
        self.storage.engine.dispose()

    def callbacks(self) -> list[Any]:
        return [
            Progress(self.settings.n_trials, self.settings.trials_timeout, self.runner.search_loss.unit),
            *([self.tracker.callback] if self.tracker else []),
        ]

    def run_trials(self) -> str:
        return run_trials(self.settings, self.study, self.runner.objective, self.callbacks())


def open_session(settings: SearchSettings, *, device: str | None = None, progress: bool = True) -> Session:
    """Load the model, open (or create) the study and its tracking, compute or read the baseline."""
    space = load_space(settings.search_space)
    tracking_uri = settings.tracking_uri or default_tracking_uri(settings)
    model, tokenizer = load_model(
        settings.model, device=device, dtype=settings.dtype, trust_remote_code=settings.trust_remote_code
    )
    layers = int(model.config.num_hidden_layers)
    evaluator = Evaluator(  # a multi-fidelity search's trials run on its shorter prompts
        model, tokenizer, settings.search_eval(), settings.study_dir / "cache", progress=progress
    )
    pilot, fidelity = None, None
    storage: optuna.storages.RDBStorage | None = None
    try:
        with study_lock(settings.study_dir):  # local workers starting together create stores one at a time
            storage = make_storage(
                settings.storage_url, settings.heartbeat_interval, settings.heartbeat_grace
            )
        if wants_pilot(settings):  # no --max-kl, no prior: the cap is measured on this model, once per study
            fidelity = fidelity_of(settings, evaluator)
            pilot = stored_pilot(settings, storage)
            if pilot is None:  # a new study; a worker that started beside this one may store its pilot first
                measured = run_pilot(settings, model, tokenizer, fidelity)
                pilot = stored_pilot(settings, storage) or measured
            if pilot.cap is not None:
                settings = settings.with_cap(pilot.cap)
        budget = Budget.from_settings(settings)  # the one conversion of the user's budget
        with study_lock(settings.study_dir):
            study = open_study(settings, layers, storage)  # fails fast on a mismatched study
            if pilot is not None and PILOT_ATTR not in study.user_attrs:  # resumes and other workers read it
                study.set_user_attr(PILOT_ATTR, pilot.to_dict())
            tracker = None
            if wanted(settings):
                prepare_mlflow_store(tracking_uri)  # a new SQLite store is made atomically (Ctrl-C safe)
                tracker = Tracker(tracking_uri, settings, study, budget)
            warm_start(study, space, layers)
        # the baseline (and a fidelity search's reference) computed once, then read from the cache
        runner = TrialRunner.build(settings, model, tokenizer, evaluator, space, budget, fidelity)
    except BaseException:
        if storage is not None:
            storage.engine.dispose()
        raise
    runner.prepare()  # the fidelity reference now, so the first trial's time (and estimate) is its own
    return Session(
        settings, model, tokenizer, study, tracker, evaluator, runner, tracking_uri, storage, pilot
    )


def run_worker(settings: SearchSettings, worker_id: int) -> str:
    """Entry point of a local worker process (``--n-workers``)."""
    import torch

    torch.set_num_threads(worker_threads(settings.n_workers))
    session = open_session(settings, device=worker_device(worker_id), progress=False)
    try:
        return session.run_trials()
    finally:
        session.close()


def _run_local_workers(settings: SearchSettings) -> None:
    from joblib import Parallel, delayed
    from joblib.externals.loky.process_executor import TerminatedWorkerError

    try:
        Parallel(n_jobs=settings.n_workers, backend="loky")(
            delayed(run_worker)(settings, i) for i in range(settings.n_workers)
        )
    except TerminatedWorkerError as exc:
        print(f"a worker died ({str(exc).splitlines()[0]}); finishing the study here", file=sys.stderr)


def run_study(settings: SearchSettings) -> int:
    """The whole search: checks, study, trials, export, held-out check, tracking. Returns 0."""
    preflight(settings)
    check_output(settings)
    if settings.n_workers > 1:  # the references here, the trials in the workers: the same reductions
        import torch

        torch.set_num_threads(worker_threads(settings.n_workers))
    session = open_session(settings)
    try:
        return _run_session(settings, session)
    finally:
        session.close()


def _run_session(settings: SearchSettings, session: Session) -> int:
    study, tracker, evaluator = session.study, session.tracker, session.evaluator
    print(
        f"study {settings.name}: {len(evaluator.examples)} validation examples of {settings.task}, "
        f"storage {redact_url(settings.storage_url)}, {finished_trials(study)}/{settings.n_trials} trials finished, "
        f"{settings.n_workers} worker(s)"
    )
    if session.pilot is not None:
        print(session.pilot.text())
    if session.runner.budget.cap is not None:
        print(f"search cap: {session.runner.budget.cap.text()}")
    if settings.n_workers > 1 and finished_trials(study) < settings.n_trials:
        _run_local_workers(session.settings)  # with the cap a pilot measured, not measured again
    stopped = session.run_trials()  # done, timeout or exhausted
    outcome = conclude(session)
    files = write_outcome(outcome, settings.study_dir)  # every file once, from the outcome
    print()
    print("\n".join(summary_lines(outcome)))
    if tracker is not None:
        status = tracker.end_study(outcome, files, stopped)  # results as artifacts, counts, FINISHED
        print(f"MLflow: parent run {tracker.parent_id} ({status}) at {redact_url(session.tracking_uri)}")
    print(f"\nresults: {settings.study_dir}/ (recommended.json, pareto/, pareto.png, keep_curves.png)")
    best = outcome.recommended
    if best is not None:
        state = "provisional: not confirmed on the task score" if outcome.provisional else "confirmed"
        print(f"load it ({state}): Schedule.load({str(settings.study_dir / 'recommended.json')!r})")
    else:
        print("no schedule is recommended (none was confirmed within the budget): recommended.json is absent")
    if tracker is not None:  # last: how to open the runs (docs/mlflow.md#the-ui)
        print("\n".join(ui_lines(session.tracking_uri, tracker.experiment_id)))
    return 0


def conclude(session: Session) -> StudyOutcome:
    """The stages after the trials: front -> confirmation -> held-out check, gathered in one outcome."""
    settings, study, runner = session.settings, session.study, session.runner
    records = study_records(study, settings.model)
    confirmation = None
    if settings.confirm_k > 0:
        judged, on = records, runner
        if settings.multi_fidelity and runner.search_loss.kind == "fidelity":
            target = at_target(records, runner)
            store_judged(study, target)  # tuner.export reads the same KLs later
            judged, on = list(target.records), target.runner
        confirmation = confirm(judged, on, settings.confirm_k, complete_trials=complete_trial_count(study))
        confirmation.store(study)  # tuner.export finds the same pick later
    outcome = StudyOutcome.from_study(study, runner.budget)  # with the judged front stored above
    outcome = dataclasses.replace(outcome, confirmation=confirmation)
    if session.pilot is not None:  # the report says what set the cap, and on what
        outcome = dataclasses.replace(outcome, notes=(*outcome.notes, session.pilot.text()))
    timing = TrialTiming.of(study, settings.n_trials, settings.trials_timeout)
    decision = decide(outcome, timing)
    outcome = dataclasses.replace(outcome, decision=explain(outcome, decision))
    outcome = dataclasses.replace(
        outcome, power=power_line(outcome, decision, recommendation_certainty(outcome))
    )
    prompts = settings.prompts_file
    note = "" if prompts is None or settings.heldout else heldout_note(prompts, settings.split_seed)
    if note:  # --no-heldout on a file too small for a check: the report says why there is none
        outcome = dataclasses.replace(outcome, notes=(*outcome.notes, note))
    if settings.heldout:
        best = outcome.recommended
        task = None
        if confirmation is not None and confirmation.recommended is not None:
            task = confirmation.recommended.loss
        outcome = dataclasses.replace(outcome, heldout=heldout_check(runner, best, task, records))
    return outcome
