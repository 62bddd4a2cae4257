"""Tune LazyLLM pruning schedules with an Optuna multi-objective study.

    python -m tuner.search --task qa --data-dir ../shared/data/longbench

Maximises the TTFT speedup and minimises the accuracy loss of per-layer schedules on the task's
LongBench validation examples, then writes the Pareto front as JSON schedules, ``recommended.json``
(the fastest within ``--max-accuracy-loss``) and plots to ``--output/<study-name>/``, and checks the
recommendation on the test split against the best of a few hand-made paper-style schedules.
Settings: dataclass defaults -> ``--preset`` YAML (``studies/*.yaml``) -> flags. Rerunning the same
command resumes the study (it stops once the study holds ``--n-trials`` finished trials).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from tqdm.auto import tqdm

from lazyllm.flops import ModelDims, flop_speedup
from lazyllm.methods import make_method
from lazyllm.models import ModelLoadError, load_model
from lazyllm.schedule import Schedule
from tuner.evaluation import EvalConfig, Evaluator, summarize
from tuner.redact import redact_url
from tuner.results import export_study
from tuner.settings import SAMPLERS, SPEEDUP_MODES, SearchSettings, resolve_settings
from tuner.spaces import list_spaces, load_space
from tuner.study import (
    StudyRunner,
    finished_trials,
    open_study,
    pareto_trials,
    study_lock,
    warm_start,
)
from tuner.tracking import Tracker, check_reachable, default_tracking_uri, end_open_runs, wanted
from tuner.workers import run_trials, worker_device, worker_threads


def _parser() -> argparse.ArgumentParser:
    d = SearchSettings()
    p = argparse.ArgumentParser(
        prog="python -m tuner.search",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Flags override the preset, which overrides the defaults shown.",
    )
    g = p.add_argument_group("what to tune")
    g.add_argument("--model", help=f"alias, checkpoint folder or hub id (default: {d.model})")
    g.add_argument("--task", help=f"LongBench category, qa, dataset or comma list (default: {d.task})")
    g.add_argument("--language", choices=["en", "zh", "all"], help=f"(default: {d.language})")
    g.add_argument(
        "--search-space", help=f"one of {', '.join(list_spaces())} or a YAML path (default: {d.search_space})"
    )
    g = p.add_argument_group("study")
    g.add_argument("--preset", help="YAML preset: a name under studies/ (e.g. qa) or a path")
    g.add_argument("--debug", action="store_true", help="show full tracebacks instead of one-line errors")
    g.add_argument(
        "--trust-remote-code",
        action="store_const",
        const=True,
        help="allow a hub model's own Python code to run (off unless given)",
    )
    g.add_argument(
        "--n-trials", type=int, help=f"finished trials the study should hold (default: {d.n_trials})"
    )
    g.add_argument("--timeout", type=float, help=f"seconds for this run's trials (default: {d.timeout})")
    g.add_argument("--study-name", help="default: <model>-<task>-<search space>")
    g.add_argument("--storage", help="Optuna storage URL (default: sqlite file in the study folder)")
    g.add_argument("--sampler", choices=SAMPLERS, help=f"(default: {d.sampler})")
    g.add_argument(
        "--n-workers", type=int, help=f"local worker processes on this study (default: {d.n_workers})"
    )
    g.add_argument("--seed", type=int, help=f"sampler seed (default: {d.seed})")
    g.add_argument(
        "--max-accuracy-loss",
        type=float,
        help=f"loss budget in score points (default: {d.max_accuracy_loss})",
    )
    g.add_argument(
        "--speedup", choices=SPEEDUP_MODES, help=f"measured TTFT or FLOP model (default: {d.speedup})"
    )
    g = p.add_argument_group("evaluation")
    g.add_argument("--data-dir", help="LongBench folder (default: $LONGBENCH_DIR)")
    g.add_argument(
        "--n-examples", type=int, help=f"validation examples per dataset (default: {d.n_examples})"
    )
    g.add_argument(
        "--max-prompt-tokens", type=int, help=f"middle truncation (default: {d.max_prompt_tokens})"
    )
    g.add_argument("--max-new-tokens", type=int, help=f"cap on answer length (default: {d.max_new_tokens})")
    g.add_argument("--split-seed", type=int, help=f"validation/test split seed (default: {d.split_seed})")
    g.add_argument(
        "--no-heldout", dest="heldout", action="store_const", const=False, help="skip the test-split check"
    )
    g = p.add_argument_group("output")
    g.add_argument("--output", help=f"results root (default: {d.output})")
    g.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI, e.g. http://127.0.0.1:5000 (default: sqlite file in the study folder; 'none' = off)",
    )
    g.add_argument(
        "--register", metavar="NAME", help="register the recommended schedule as MLflow model NAME"
    )
    return p


def settings_from_args(argv: Sequence[str] | None) -> SearchSettings:
    args = vars(_parser().parse_args(argv))
    preset = args.pop("preset")
    args.pop("debug")
    return resolve_settings(preset, args)


def _check_output(settings: SearchSettings) -> None:
    folder = settings.study_dir
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ValueError(
            f"output folder {folder} is not writable ({exc.strerror}); pass --output DIR"
        ) from None


def _eval_config(settings: SearchSettings, split: str) -> EvalConfig:
    return EvalConfig(
        model=settings.model,
        task=settings.task,
        language=settings.language,
        split=split,
        split_seed=settings.split_seed,
        n_examples=settings.n_examples,
        max_prompt_tokens=settings.max_prompt_tokens,
        max_new_tokens=settings.max_new_tokens,
        data_dir=settings.data_dir,
    )


class Progress:
    """Optuna callback: trial k/N, its values, the current Pareto front and the time left."""

    def __init__(self, target: int, timeout: float | None) -> None:
        self.target = target
        self.timeout = timeout
        self.start = time.monotonic()
        self.durations: list[float] = []

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        done = finished_trials(study)
        if trial.duration is not None:
            self.durations.append(trial.duration.total_seconds())
        per = statistics.median(self.durations) if self.durations else 0.0
        left = max(0, self.target - done) * per
        if self.timeout is not None:
            left = min(left, max(0.0, self.timeout - (time.monotonic() - self.start)))
        if trial.values:
            what = f"speedup {trial.values[0]:.2f}x, loss {trial.values[1]:.2f}"
        else:
            what = f"{trial.state.name.lower()}: {trial.user_attrs.get('stopped_early', '')}"
        front = ", ".join(
            f"#{t.number} {t.values[0]:.2f}x/{t.values[1]:.2f}" for t in pareto_trials(study)[:6]
        )
        tqdm.write(
            f"[trial {done}/{self.target}] #{trial.number} {what} | front: {front} | ~{left / 60:.1f} min left"
        )


def heldout_check(
    settings: SearchSettings, model: Any, tokenizer: Any, validation: Evaluator, recommended: Schedule | None
) -> dict[str, Any]:
    """Best hand-made paper-style schedule (picked on validation) vs the recommendation, on test."""
    layers = int(model.config.num_hidden_layers)
    dims = ModelDims.from_config(model.config)
    grid = {}
    for start in sorted({layers // 4, layers // 2}):
        for keep in (0.3, 0.5):
            stages = max(1, min(4, layers - 1 - start))
            name = f"paper start={start} keep={keep}"
            grid[name] = Schedule.progressive(
                settings.model, layers, start_layer=start, final_keep=keep, stages=stages
            )

    def speed(summary: dict[str, Any], schedule: Schedule, ev: Evaluator) -> float:
        if settings.speedup == "flops":
            n = round(statistics.fmean(len(e.input_ids) for e in ev.examples))
            return flop_speedup(schedule, dims, n)
        return float(summary["ttft_speedup"])

    base_val = validation.baseline_results()
    hand: dict[str, tuple[float, float]] = {}
    for name, sched in grid.items():
        res, _ = validation.evaluate("lazyllm", make_method("lazyllm", model, tokenizer, sched), desc=name,
                                     paired_timing=settings.speedup == "measured")  # fmt: skip
        s = summarize(res, base_val)
        hand[name] = (speed(s, sched, validation), float(s["accuracy_loss"]))
    ok = [n for n, (_, loss) in hand.items() if loss <= settings.max_accuracy_loss]
    best_hand = max(ok, key=lambda n: hand[n][0]) if ok else min(hand, key=lambda n: hand[n][1])

    test = Evaluator(
        model, tokenizer, _eval_config(settings, "test"), settings.study_dir / "cache", progress=True
    )
    base_test = test.baseline_results()
    rows = []
    candidates: list[tuple[str, Schedule, float, float]] = []
    if recommended is not None:
        metrics = recommended.metadata.get("metrics", {})
        candidates.append(
            ("recommended", recommended, float(metrics["speedup"]), float(metrics["accuracy_loss"]))
        )
    candidates.append((f"best hand-made ({best_hand})", grid[best_hand], *hand[best_hand]))
    for label, sched, val_speed, val_loss in candidates:
        res, _ = test.evaluate(
            "lazyllm",
            make_method("lazyllm", model, tokenizer, sched),
            desc=f"{label} (test)",
            paired_timing=settings.speedup == "measured",
        )
        test_summary = summarize(res, base_test)
        rows.append(
            {
                "schedule": label,
                "validation_speedup": round(val_speed, 3),
                "validation_loss": round(val_loss, 2),
                "test_speedup": round(speed(test_summary, sched, test), 3),
                "test_loss": round(float(test_summary["accuracy_loss"]), 2),
                "test_score": round(float(test_summary["score"]), 2),
                "test_baseline_score": round(float(test_summary["baseline_score"]), 2),
                "n_validation": len(validation.examples),
                "n_test": len(test.examples),
            }
        )
    return {"hand_made_validation": hand, "best_hand_made": best_hand, "rows": rows}


@dataclass
class Session:
    """What one process needs to run trials: model, study, tracker, evaluator and the trial runner."""

    model: Any
    tokenizer: Any
    study: optuna.Study
    tracker: Tracker | None
    evaluator: Evaluator
    runner: StudyRunner
    tracking_uri: str

    def callbacks(self, settings: SearchSettings) -> list[Any]:
        return [
            Progress(settings.n_trials, settings.timeout),
            *([self.tracker.callback] if self.tracker else []),
        ]


def open_session(settings: SearchSettings, *, device: str | None = None, progress: bool = True) -> Session:
    space = load_space(settings.search_space)
    tracking_uri = settings.tracking_uri or default_tracking_uri(settings)
    model, tokenizer = load_model(settings.model, device=device, trust_remote_code=settings.trust_remote_code)
    layers = int(model.config.num_hidden_layers)
    with study_lock(settings.study_dir):  # local workers starting together create stores one at a time
        study = open_study(settings, layers)  # fails fast on an unreachable storage or a mismatched study
        tracker = Tracker(tracking_uri, settings, study) if wanted(settings) else None
        warm_start(study, space, layers)
    evaluator = Evaluator(
        model,
        tokenizer,
        _eval_config(settings, "validation"),
        settings.study_dir / "cache",
        progress=progress,
    )
    runner = StudyRunner(settings, model, tokenizer, evaluator, space)  # computes / loads the baseline
    return Session(model, tokenizer, study, tracker, evaluator, runner, tracking_uri)


def _worker(settings: SearchSettings, worker_id: int) -> str:
    """Entry point of a local worker process (``--n-workers``)."""
    import torch

    torch.set_num_threads(worker_threads(settings.n_workers))
    session = open_session(settings, device=worker_device(worker_id), progress=False)
    return run_trials(settings, session.study, session.runner.objective, session.callbacks(settings))


def run(settings: SearchSettings) -> int:
    _check_output(settings)
    load_space(settings.search_space)  # an unknown space fails before anything loads
    if wanted(settings):
        check_reachable(settings.tracking_uri or default_tracking_uri(settings))  # before any trial
    session = open_session(settings)
    study, tracker, evaluator = session.study, session.tracker, session.evaluator
    model, tokenizer, tracking_uri = session.model, session.tokenizer, session.tracking_uri
    print(
        f"study {settings.name}: {len(evaluator.examples)} validation examples of {settings.task}, "
        f"storage {redact_url(settings.storage_url)}, {finished_trials(study)}/{settings.n_trials} trials finished, "
        f"{settings.n_workers} worker(s)"
    )
    if settings.n_workers > 1 and finished_trials(study) < settings.n_trials:
        from joblib import Parallel, delayed
        from joblib.externals.loky.process_executor import TerminatedWorkerError

        try:
            Parallel(n_jobs=settings.n_workers, backend="loky")(
                delayed(_worker)(settings, i) for i in range(settings.n_workers)
            )
        except TerminatedWorkerError as exc:
            print(f"a worker died ({str(exc).splitlines()[0]}); finishing the study here", file=sys.stderr)
    run_trials(settings, study, session.runner.objective, session.callbacks(settings))
    exported = export_study(study, settings.study_dir, settings.max_accuracy_loss)
    print(f"\nPareto front ({len(exported['front'])} trials; speedup = {settings.speedup}):")
    for row in exported["front"]:
        print(f"  trial {row['trial']:>3}: speedup {row['speedup']:.2f}x, accuracy loss {row['accuracy_loss']:.2f}, "
              f"FLOP model {row['flop_speedup']:.2f}x, {row['prompt_computed_pct']:.1f}% computed")  # fmt: skip
    recommended = Schedule.load(exported["recommended"]) if exported["recommended"] else None
    if settings.heldout:
        report = heldout_check(settings, model, tokenizer, evaluator, recommended)
        (settings.study_dir / "heldout.json").write_text(json.dumps(report, indent=2) + "\n")
        print("\nHeld-out check (test split; hand-made schedule picked on validation):")
        for r in report["rows"]:
            print(f"  {r['schedule']}: validation {r['validation_speedup']:.2f}x / loss {r['validation_loss']:.2f} "
                  f"(n={r['n_validation']}); test {r['test_speedup']:.2f}x / loss {r['test_loss']:.2f} "
                  f"(score {r['test_score']:.2f} vs {r['test_baseline_score']:.2f}, n={r['n_test']})")  # fmt: skip
    if tracker is not None:
        status = tracker.end_study()  # results as artifacts, counts, FINISHED (or KILLED on timeout)
        print(f"MLflow: parent run {tracker.parent_id} ({status}) at {redact_url(tracking_uri)}")
    print(f"\nresults: {settings.study_dir}/ (recommended.json, pareto/, pareto.png, keep_curves.png)")
    if exported["recommended"]:
        print(f"load it: Schedule.load({str(exported['recommended'])!r})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    debug = os.environ.get("LAZYLLM_DEBUG") == "1" or "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        settings = settings_from_args(argv)
        return run(settings)
    except KeyboardInterrupt:
        end_open_runs("KILLED", "interrupted (Ctrl-C)")
        print("\ninterrupted: finished trials are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    except (ValueError, ModelLoadError) as exc:
        end_open_runs("FAILED", f"error: {exc}")
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
