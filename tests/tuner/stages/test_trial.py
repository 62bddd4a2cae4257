"""tuner.stages.trial on a tiny random model, real LongBench records and in-memory Optuna studies: what a
trial proposes, the duplicates it refuses, the trials it stops early, the speedup it times, and what
its TrialRecord holds."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from lazyllm.flops import flop_speedup
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner.evaluation.losses import Budget, FidelityLoss, ScoreLoss
from tuner.evaluation.runner import Evaluator
from tuner.stages.trial import SPEED_FLOOR_CONSTRAINT, TrialRunner, fresh_draw
from tuner.statistics.speed import DEFAULT_PLAUSIBLE
from tuner.study.records import TrialRecord, schedule_key
from tuner.study.settings import SearchSettings
from tuner.study.spaces import load_space
from tuner.study.spaces.base import KEEP_ALL_ATTR
from tuner.study.storage import warm_start
from tuner.study.workers import DUPLICATE_ATTR, DuplicateSchedule, SurplusTrial

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = 4  # tiny_folder's depth
SPACE = load_space("stages")
PAPER = SPACE.warm_start(LAYERS)[0]  # the paper-style warm start: prunes a 64-token prompt


@dataclasses.dataclass(frozen=True)
class Made:
    """The study's model and examples (two: one hotpotqa, one trec), built once for the module."""

    settings: SearchSettings
    model: Any
    tokenizer: Any
    evaluator: Evaluator

    def runner(self, budget: Budget | None = None, **changes: Any) -> TrialRunner:
        settings = dataclasses.replace(self.settings, **changes)
        budget = budget if budget is not None else Budget.from_settings(settings)
        return TrialRunner.build(settings, self.model, self.tokenizer, self.evaluator, SPACE, budget)


@pytest.fixture(scope="module")
def made(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Made:
    out = tmp_path_factory.mktemp("trial")
    settings = SearchSettings(
        model=str(tiny_folder), task="hotpotqa,trec", n_examples=1, max_prompt_tokens=64, max_new_tokens=2,
        data_dir=longbench_dir(), output=str(out), study_name="t", sampler="random", tracking_uri="none",
        speedup="flops", timing_rounds=1, max_kl=10.0,
    )  # fmt: skip
    model, tokenizer = load_model(str(tiny_folder), device="cpu")
    return Made(
        settings, model, tokenizer, Evaluator(model, tokenizer, settings, out / "cache", progress=False)
    )


def _study(seed: int = 0) -> optuna.Study:
    return optuna.create_study(
        directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=seed)
    )


def _ask(study: optuna.Study, params: dict[str, Any] | None = None, **user_attrs: Any) -> optuna.Trial:
    """The next trial, ``params`` queued for it first (a queued trial, as the warm starts are)."""
    if params is not None:
        study.enqueue_trial(params, user_attrs=user_attrs or None)
    return study.ask()


# --- proposal ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("revival", ["frozen", "dynamic", "budget:8"])
def test_a_proposal_is_the_space_schedule_with_the_study_revival(made: Made, revival: str) -> None:
    runner = made.runner(revival=revival)
    study = _study()
    reference = runner.propose(_ask(study, {}, **{KEEP_ALL_ATTR: True}))
    assert reference.percentiles == (0.0,) * LAYERS and str(reference.revival) == revival
    trial = _ask(study, PAPER)
    proposed = runner.propose(trial)
    assert proposed == SPACE.to_schedule(PAPER, made.settings.model, LAYERS).with_revival(revival)
    assert str(proposed.revival) == revival and any(p > 0 for p in proposed.percentiles)
    sampled = study.ask()  # the sampler's own draw, asked for by the space
    assert runner.propose(sampled) == SPACE.to_schedule(
        sampled.params, made.settings.model, LAYERS
    ).with_revival(revival)


# --- what a trial records ---------------------------------------------------------------------------


def test_a_complete_trial_records_what_it_measured(made: Made) -> None:
    runner = made.runner()
    study = _study()
    warm_start(study, SPACE, LAYERS)
    study.optimize(runner.objective, n_trials=2)
    reference, paper = study.trials[:2]
    assert reference.state == paper.state == TrialState.COMPLETE
    keys = {e.key for e in made.evaluator.examples}
    records = [TrialRecord.from_trial(t, made.settings.model) for t in (reference, paper)]
    for t, r in zip((reference, paper), records):
        assert r is not None and r.number == t.number and r.params == t.params
        assert r.accuracy == "fidelity" and r.stopped is None
        assert (
            r.examples_run == 2 and set(r.per_example) == keys and set(r.per_dataset) == {"hotpotqa", "trec"}
        )
        assert r.loss is not None and r.loss.n == 2 and r.loss.level == made.settings.confidence
        assert r.values == tuple(t.values)  # the objectives Optuna ranks are the record's
        # a FLOP-model search times nothing: its speed objective is the FLOP model's
        assert r.speed is None and r.speedup == r.flop_speedup
        assert t.constraints == {"accuracy_loss": pytest.approx(r.loss.upper - runner.search_loss.budget)}
        prov = r.provenance
        assert (prov["model"], prov["task"], prov["sampler"], prov["seed"], prov["speedup_kind"]) == (
            made.settings.model, "hotpotqa,trec", "random", made.settings.seed, "flops",
        )  # fmt: skip
        assert prov["timing_example"] in keys and prov["timing_prompt_tokens"] == len(
            runner.timing_example.input_ids
        )
        assert prov["wall_time_s"] > 0 and prov["lazyllm_version"]
    keep_all, pruned = records
    assert keep_all is not None and pruned is not None and keep_all.loss is not None
    assert keep_all.schedule == Schedule.keep_all(made.settings.model, LAYERS).with_revival("frozen")
    assert keep_all.flop_speedup == 1.0 and keep_all.prompt_computed_pct == 100.0
    assert keep_all.loss.value == pytest.approx(0.0, abs=1e-9)  # keep-all is the reference: no drift
    assert pruned.schedule == SPACE.to_schedule(PAPER, made.settings.model, LAYERS).with_revival("frozen")
    prompt = runner.prompt_tokens
    assert pruned.flop_speedup == pytest.approx(flop_speedup(pruned.schedule, runner.dims, prompt))
    kept = sum(pruned.schedule.keep_counts(prompt))
    assert (
        pruned.prompt_computed_pct == pytest.approx(100.0 * kept / (prompt * LAYERS))
        and kept < prompt * LAYERS
    )


# --- duplicates -------------------------------------------------------------------------------------


def test_a_repeated_schedule_takes_no_slot_and_queues_a_fresh_draw(made: Made) -> None:
    runner = made.runner()
    study = _study()
    study.enqueue_trial(PAPER)
    study.enqueue_trial(PAPER)
    study.optimize(runner.objective, n_trials=2)
    first, second = study.trials[:2]
    assert first.state == TrialState.COMPLETE
    assert second.state == TrialState.PRUNED and second.system_attrs[DUPLICATE_ATTR] == first.number
    assert TrialRecord.from_trial(second) is None  # refused before it evaluated anything
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    queued = [t.system_attrs["fixed_params"] for t in waiting]
    assert queued == [fresh_draw(SPACE, LAYERS, made.settings.seed, second.number)]
    # the fresh draw runs next, as a schedule of its own
    study.optimize(runner.objective, n_trials=1)
    third = study.trials[2]
    assert queued[0].items() <= third.params.items() and DUPLICATE_ATTR not in third.system_attrs
    record = TrialRecord.from_trial(third)
    assert record is not None and schedule_key(record.schedule) != schedule_key(
        TrialRecord.from_trial(first).schedule  # type: ignore[union-attr]
    )


def test_a_schedule_still_being_evaluated_counts_as_held(made: Made) -> None:
    runner = made.runner()
    study = _study()
    running = _ask(study, PAPER)  # another worker's trial: proposed (its parameters asked), no record yet
    schedule = runner.propose(running)
    assert runner.evaluated(study, running.number) == {}  # only earlier trials hold schedules
    assert runner.evaluated(study, running.number + 1) == {schedule_key(schedule): running.number}
    again = _ask(study, PAPER)
    with pytest.raises(DuplicateSchedule, match=f"the schedule of trial {running.number}"):
        runner.refuse_duplicate(again, runner.propose(again))
    assert study.trials[again.number].system_attrs[DUPLICATE_ATTR] == running.number
    fresh = study.ask()  # the draw queued in the duplicate's place comes next
    assert study.trials[fresh.number].system_attrs["fixed_params"] == fresh_draw(
        SPACE, LAYERS, made.settings.seed, again.number
    )
    study.tell(fresh, state=TrialState.PRUNED)
    # another revival is another schedule
    other = _ask(study, PAPER)
    runner.refuse_duplicate(other, made.runner(revival="dynamic").propose(other))
    study.tell(other, state=TrialState.PRUNED)
    # the first trial's worker dies: a failed trial holds nothing, nor does the refused duplicate still
    # winding down (RUNNING, with the same parameters), so the schedule may be evaluated again
    study.tell(running, state=TrialState.FAIL)
    retry = _ask(study, PAPER)
    runner.refuse_duplicate(retry, runner.propose(retry))
    assert runner.evaluated(study, retry.number + 1) == {schedule_key(schedule): retry.number}


def test_a_trial_beyond_n_trials_takes_no_slot(made: Made) -> None:
    runner = made.runner(n_trials=1)
    study = _study()
    study.enqueue_trial(PAPER)
    study.optimize(runner.objective, n_trials=1)
    extra = study.ask()  # a worker that started one too many
    with pytest.raises(SurplusTrial, match="already has 1 trials"):
        runner.objective(extra)
    frozen = study.trials[extra.number]
    assert frozen.user_attrs == {"surplus": True} and not frozen.params  # nothing proposed, nothing run


# --- stopping early ---------------------------------------------------------------------------------


def test_a_trial_that_cannot_meet_the_budget_stops_with_its_reason(made: Made) -> None:
    tight = Budget(FidelityLoss(1e-12), ScoreLoss(2.0))  # any drift at all breaks it
    runner = made.runner(budget=tight)
    study = _study()
    study.enqueue_trial(PAPER)
    study.optimize(runner.objective, n_trials=1)
    trial = study.trials[0]
    assert trial.state == TrialState.PRUNED and trial.values is None
    record = TrialRecord.from_trial(trial)
    assert record is not None and record.loss is None and record.speedup is None
    assert record.examples_run == 1  # stopped after the first of two examples
    assert record.stopped is not None and record.stopped.startswith("mean KL >= ")
    assert "accuracy_loss" not in trial.constraints
    assert record.flop_speedup > 1.0 and record.provenance["wall_time_s"] > 0


def test_a_proposal_under_the_speed_floor_runs_nothing_and_a_queued_one_runs(made: Made) -> None:
    runner = made.runner(min_speedup=50.0)
    study = _study()
    study.enqueue_trial(PAPER)
    study.optimize(runner.objective, n_trials=2)
    queued, proposed = study.trials[:2]
    assert queued.state == TrialState.COMPLETE and SPEED_FLOOR_CONSTRAINT not in queued.constraints
    assert proposed.state == TrialState.PRUNED
    record = TrialRecord.from_trial(proposed)
    assert record is not None and record.examples_run == 0 and record.loss is None
    assert record.stopped is not None and "under --min-speedup 50: not evaluated" in record.stopped
    assert proposed.constraints[SPEED_FLOOR_CONSTRAINT] == pytest.approx(50.0 - record.flop_speedup)


def test_rivals_are_the_finished_feasible_trials_at_least_as_fast(made: Made) -> None:
    runner = made.runner()
    study = _study()
    warm_start(study, SPACE, LAYERS)
    study.optimize(runner.objective, n_trials=3)
    done = [TrialRecord.from_trial(t) for t in study.trials if t.state == TrialState.COMPLETE]
    speeds = sorted(r.values[0] for r in done if r is not None)
    assert len(speeds) == 3 and speeds[0] == 1.0 < speeds[-1]  # keep-all and two faster schedules
    keep_all = Schedule.keep_all(made.settings.model, LAYERS)
    assert sorted(r.speedup for r in runner.rivals(study, keep_all)) == speeds  # all at least as fast
    fastest = next(r for r in done if r is not None and r.values[0] == speeds[-1])
    rivals = runner.rivals(study, fastest.schedule)
    assert [(r.trial, r.speedup, r.loss) for r in rivals] == [(fastest.number, *fastest.values)]
    beyond = Schedule.from_layers(made.settings.model, LAYERS, {0: 90})  # faster than anything run
    assert runner.rivals(study, beyond) == []
    # an infeasible trial is no rival: nothing is within a zero budget but the drift-free keep-all
    strict = made.runner(budget=Budget(FidelityLoss(0.0), ScoreLoss(2.0)))
    assert [r.speedup for r in strict.rivals(study, keep_all)] == [1.0]
    # a timed search learns a schedule's speed only by running it: no rivals
    assert made.runner(speedup="measured").rivals(study, keep_all) == []


# --- timing -----------------------------------------------------------------------------------------


def test_only_the_speedup_the_objective_names_is_timed(made: Made) -> None:
    paper = SPACE.to_schedule(PAPER, made.settings.model, LAYERS).with_revival("frozen")
    flops = made.runner()
    assert flops.measure_speed(flops.engine(paper), paper) is None
    ttft = made.runner(speedup="measured", timing_rounds=2)
    m = ttft.measure_speed(ttft.engine(paper), paper)
    assert m is not None and m.clock == "cpu" and len(m.baseline_s) >= 2  # auto: CPU time on a CPU
    assert m.bounds == DEFAULT_PLAUSIBLE  # TTFT is checked against the FLOP model of the prefill
    assert m.flop_speedup == pytest.approx(flop_speedup(paper, ttft.dims, len(ttft.timing_example.input_ids)))
    total = made.runner(speedup="total", timing_rounds=2, timed_new_tokens=3)
    m = total.measure_speed(total.engine(paper), paper)
    assert m is not None and m.bounds == (1e-3, 1e3)  # the whole generation: the FLOP model says little
    assert ttft.measure_speed(ttft.engine(paper), paper, kind="flops") is None  # asked by name

    # a timed search's trial records the measurement and ranks by it
    study = _study()
    study.enqueue_trial(PAPER)
    study.optimize(ttft.objective, n_trials=1)
    record = TrialRecord.from_trial(study.trials[0])
    assert record is not None and record.speed is not None
    assert record.speedup == record.speed.speedup == study.trials[0].values[0]
    assert record.provenance["speedup_kind"] == "measured"


def test_speed_is_timed_on_the_example_of_typical_length(made: Made) -> None:
    runner = made.runner()
    lengths = {e.key: len(e.input_ids) for e in made.evaluator.examples}
    mean = sum(lengths.values()) / len(lengths)
    assert runner.prompt_tokens == round(mean)
    chosen = runner.timing_example.key
    best = min(abs(n - runner.prompt_tokens) for n in lengths.values())
    assert abs(lengths[chosen] - runner.prompt_tokens) == best
    assert chosen == min(k for k, n in lengths.items() if abs(n - runner.prompt_tokens) == best)
