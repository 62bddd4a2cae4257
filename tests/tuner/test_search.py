"""tuner.search end to end on a tiny model with real LongBench records; settings; early-stop logic."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from lazyllm.schedule import Schedule
from tests.support import longbench_dir, n_warm_starts
from tuner.evaluation.losses import BaselineStats, ScoreLoss, optimistic_loss
from tuner.evaluation.runner import ExampleResult
from tuner.search import main, parse_settings
from tuner.stages.trial import SPEED_FLOOR_CONSTRAINT, fresh_draw
from tuner.study.records import RECORD_ATTR, TrialRecord, schedule_key
from tuner.study.settings import SearchSettings, resolve_settings
from tuner.study.spaces import load_space
from tuner.study.spaces.base import KEEP_ALL_ATTR


def _argv(folder: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", "hotpotqa,trec", "--n-examples", "1", "--max-prompt-tokens", "128",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "s",
        "--sampler", "random", *extra,
    ]  # fmt: skip


def test_study_end_to_end_and_resume(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "2")) == 0
    out = capsys.readouterr().out
    assert "Pareto front" in out and "Held-out check" in out
    study_dir = tmp_path / "s"
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{study_dir / 'study.db'}")
    trials = [
        t for t in study.get_trials() if t.state != optuna.trial.TrialState.WAITING
    ]  # the peers' warm starts wait
    assert len(trials) == 2 and all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    # keep-all first (the reference trial: no parameters, so no point of the sampler's space), then paper-style
    assert trials[0].params == {} and trials[0].user_attrs[KEEP_ALL_ATTR] is True
    assert trials[1].params["n_stages"] > 0
    records = [TrialRecord.from_trial(t) for t in trials]
    for t, r in zip(trials, records):
        assert set(t.user_attrs) - {KEEP_ALL_ATTR} == {RECORD_ATTR}  # the one user attr a trial stores
        assert r is not None and r.values == tuple(t.values) and r.accuracy == "fidelity"
        assert set(r.per_dataset) == {"hotpotqa", "trec"}
        assert list(t.constraints) == ["accuracy_loss"]
        assert r.schedule == r.schedule.with_revival("frozen")  # the study's revival, in the record
    # keep-all loses nothing: its predictions are the baseline's
    assert records[0].values[1] == 0.0 and records[0].prompt_computed_pct == 100.0  # type: ignore[union-attr]
    recommended = Schedule.load(study_dir / "recommended.json")
    recommended.check_model(str(tiny_folder), 4)
    assert recommended.metadata["study"] == "s" and recommended.metadata["split"] == "validation"
    front = json.loads((study_dir / "pareto.json").read_text())
    assert front and all((study_dir / row["file"]).exists() for row in front)
    for name in ("pareto.png", "pareto.html", "keep_curves.png", "pareto.csv", "heldout.json"):
        assert (study_dir / name).stat().st_size > 0
    heldout = json.loads((study_dir / "heldout.json").read_text())
    assert [r["schedule"].split(" (")[0] for r in heldout["rows"]] == [
        "recommended",
        "best paper-style",
        "best one-stage",
    ]
    for r in heldout["rows"]:  # scores are macro averages like the loss: they differ by the loss
        assert r["test_baseline_score"] - r["test_score"] == pytest.approx(r["test_loss"], abs=0.02)
        # the search ran on the FLOP model; the held-out check times TTFT all the same
        assert r["test_speedup_kind"] == "measured" and r["test_speedup"] != r["test_flop_speedup"]

    # the same command with a larger count adds trials; nothing finished is redone
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "3", "--no-heldout")) == 0
    again = optuna.load_study(study_name="s", storage=f"sqlite:///{study_dir / 'study.db'}").get_trials()
    again = [t for t in again if t.state != optuna.trial.TrialState.WAITING]
    assert len(again) == 3 and [t.params for t in again[:2]] == [t.params for t in trials]
    # the same count again: nothing to do
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "3", "--no-heldout")) == 0
    states = [
        t.state
        for t in optuna.load_study(study_name="s", storage=f"sqlite:///{study_dir / 'study.db'}").get_trials()
    ]
    assert len([s for s in states if s != optuna.trial.TrialState.WAITING]) == 3
    # other settings under the same name are refused
    capsys.readouterr()
    assert main([*_argv(tiny_folder, tmp_path, "--n-trials", "3"), "--max-prompt-tokens", "64"]) == 2
    assert "made with other settings" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--sampler", "bogus"], "invalid choice"),
        (["--search-space", "bogus"], "Unknown search space 'bogus'"),
        (["--task", "bogus"], "Unknown task 'bogus'"),
        (["--n-trials", "0"], "n_trials = 0"),
        (["--preset", "bogus"], "Unknown preset 'bogus'"),
    ],
)
def test_bad_inputs_fail_fast(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], fragment: str
) -> None:
    argv = [*_argv(tiny_folder, tmp_path), *flags]
    if "invalid choice" in fragment:
        with pytest.raises(SystemExit):
            main(argv)
    else:
        assert main(argv) == 2
    assert fragment in capsys.readouterr().err


def test_settings_precedence(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text("n_trials: 5\nsampler: nsga2\nmax_prompt_tokens: 512\n")
    s = parse_settings(["--preset", str(preset), "--n-trials", "7"])
    assert (s.n_trials, s.sampler, s.max_prompt_tokens, s.task) == (7, "nsga2", 512, SearchSettings().task)
    assert resolve_settings("qa", {}).task == "qa"
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_trails: 5\n")
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['n_trails'\]"):
        resolve_settings(str(bad), {})
    with pytest.raises(ValueError, match="study_name"):
        SearchSettings(study_name="../escape")
    s = SearchSettings(model="smollm2-135m", task="qa", search_space="stages", output=str(tmp_path))
    assert s.name == "smollm2-135m-qa-stages" and s.storage_url.endswith("smollm2-135m-qa-stages/study.db")


def _result(dataset: str, score: float) -> ExampleResult:
    return ExampleResult(dataset, "id", "lazyllm", "", score, 1.0, 1.0, 10, 1, 1.0)


def test_optimistic_loss_bound() -> None:
    baseline = {"a": 50.0, "b": 100.0}  # macro 75
    counts = {"a": 2, "b": 2}
    # nothing run yet: the best case is a perfect 100 -> loss -25
    assert optimistic_loss([], baseline, counts) == pytest.approx(-25.0)
    # a: 0 and 0 (done) -> 0; b: unknown -> 100 => macro 50, loss >= 25
    assert optimistic_loss([_result("a", 0.0), _result("a", 0.0)], baseline, counts) == pytest.approx(25.0)
    # b: one 0, one still open -> 50; a open -> 100 => macro 75, loss >= 0
    assert optimistic_loss([_result("b", 0.0)], baseline, counts) == pytest.approx(0.0)


def test_early_stop_rule_and_pruned_trials(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = BaselineStats(results=(), scores={"a": 50.0, "b": 100.0}, counts={"a": 2, "b": 2})
    loss = ScoreLoss(10.0)
    assert loss.early_stop(base, [_result("b", 0.0)]) is None
    reason = loss.early_stop(base, [_result("a", 0.0), _result("a", 0.0)])
    assert reason is not None and "accuracy loss >= 25.00 score points after 2 examples" in reason

    # a trial whose early-stop rule fires is recorded as PRUNED, with the reason and how far it got
    monkeypatch.setattr(
        ScoreLoss, "early_stop", lambda self, base, results: "out of budget" if len(results) >= 1 else None
    )
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "2", "--no-heldout", "--accuracy", "score")) == 0
    trials = optuna.load_study(
        study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}"
    ).get_trials()
    assert [t.state for t in trials if t.state != optuna.trial.TrialState.WAITING] == [
        optuna.trial.TrialState.PRUNED
    ] * 2
    record = TrialRecord.from_trial(trials[0])
    assert record is not None and record.stopped == "out of budget" and record.examples_run == 1
    assert record.loss is None and record.schedule.percentiles == (0.0,) * 4


def test_a_schedule_already_evaluated_takes_no_slot(tiny_folder: Path, tmp_path: Path) -> None:
    """A proposal that repeats an evaluated schedule is refused (not counted), and a fresh draw is
    queued: the study still ends with n_trials distinct schedules. Keep-all is one schedule whatever
    its scoring rule (nothing is pruned, so nothing is scored)."""
    assert (
        main(_argv(tiny_folder, tmp_path, "--n-trials", "2", "--no-heldout", "--tracking-uri", "none")) == 0
    )
    storage = f"sqlite:///{tmp_path / 's' / 'study.db'}"
    again = {KEEP_ALL_ATTR: True}
    optuna.load_study(study_name="s", storage=storage).enqueue_trial({}, user_attrs=again)  # keep-all again
    # the remaining warm starts run first, then the repeated keep-all, then the draw that replaces it
    n = n_warm_starts() + 1  # the reference, the warm starts, then the draw replacing the repeat
    assert (
        main(_argv(tiny_folder, tmp_path, "--n-trials", str(n), "--no-heldout", "--tracking-uri", "none"))
        == 0
    )
    trials = optuna.load_study(study_name="s", storage=storage).get_trials()
    refused = [t for t in trials if "duplicate_of" in t.system_attrs]
    # the repeated keep-all first; a replacement draw may repeat a schedule too (a 4-layer model has few)
    # and is refused the same way
    assert refused and refused[0].system_attrs["duplicate_of"] == 0 and refused[0].user_attrs[KEEP_ALL_ATTR]
    for t in refused:
        assert t.state == optuna.trial.TrialState.PRUNED and RECORD_ATTR not in t.user_attrs  # no failure
        assert t.system_attrs["duplicate_of"] < t.number
    done = [TrialRecord.from_trial(t) for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == n  # the refused proposal took no slot: a fresh draw ran instead
    keys = {schedule_key(r.schedule) for r in done if r is not None}
    assert len(keys) == n  # n slots, n different schedules
    assert not [t for t in trials if t.state == optuna.trial.TrialState.FAIL]  # nothing failed


def test_proposals_under_the_speed_floor_run_nothing_and_are_infeasible(
    tiny_folder: Path, tmp_path: Path
) -> None:
    """With a floor no schedule of a 4-layer model reaches, every proposal of the sampler is stopped
    before a single example (its record says why, its speed-floor constraint says by how much) and
    takes its slot, while the queued reference and warm starts run as always."""
    n = n_warm_starts() + 3  # the queued trials, then three of the sampler's own
    argv = _argv(tiny_folder, tmp_path, "--n-trials", str(n), "--no-heldout", "--tracking-uri", "none")
    assert main([*argv, "--min-speedup", "50"]) == 0
    trials = optuna.load_study(
        study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}"
    ).get_trials()
    queued = [t for t in trials if "fixed_params" in t.system_attrs]
    proposed = [t for t in trials if "fixed_params" not in t.system_attrs]
    assert len(queued) == n_warm_starts() and len(proposed) == 3
    for t in queued:  # every queued schedule was evaluated, whatever its speed
        record = TrialRecord.from_trial(t)
        assert record is not None and record.examples_run > 0 and SPEED_FLOOR_CONSTRAINT not in t.constraints
    for t in proposed:
        record = TrialRecord.from_trial(t)
        assert t.state == optuna.trial.TrialState.PRUNED and record is not None
        assert record.examples_run == 0 and record.loss is None
        assert record.stopped is not None and "under --min-speedup 50" in record.stopped
        assert t.constraints[SPEED_FLOOR_CONSTRAINT] == pytest.approx(50 - record.flop_speedup)


def test_the_speed_floor_is_off_at_one(tiny_folder: Path, tmp_path: Path) -> None:
    """--min-speedup 1 stops nothing: the sampler's proposals are evaluated like the queued ones."""
    n = n_warm_starts() + 2
    argv = _argv(tiny_folder, tmp_path, "--n-trials", str(n), "--no-heldout", "--tracking-uri", "none")
    assert main([*argv, "--min-speedup", "1"]) == 0
    trials = optuna.load_study(
        study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}"
    ).get_trials()
    proposed = [TrialRecord.from_trial(t) for t in trials if "fixed_params" not in t.system_attrs]
    assert len(proposed) == 2 and all(r is not None and r.examples_run > 0 for r in proposed)


def test_the_draw_replacing_a_duplicate_depends_on_the_study_seed() -> None:
    """Defect: the replacement draw was seeded by the trial number alone, so seeds 0 and 1 queued the
    same schedules after their refusals (both default studies recommended the same trial-74 draw)."""
    space = load_space("stages")
    draws = {seed: [fresh_draw(space, 30, seed, n) for n in range(60, 80)] for seed in (0, 1)}
    assert draws[0] == [fresh_draw(space, 30, 0, n) for n in range(60, 80)]  # reproducible
    assert sum(a == b for a, b in zip(draws[0], draws[1])) <= 2  # independent across seeds
    assert len({json.dumps(d, sort_keys=True) for d in draws[0]}) >= 15  # and across trial numbers
    for d in draws[0]:
        space.to_schedule(d, "m", 30)  # inside the space


def test_total_speedup_objective_and_the_study_revival_policy(tiny_folder: Path, tmp_path: Path) -> None:
    """--speedup total optimises the whole-generation speedup; both speedups are recorded either way, and
    every trial's schedule carries the study's revival policy into the exported JSON."""
    argv = _argv(tiny_folder, tmp_path, "--n-trials", "2", "--no-heldout", "--tracking-uri", "none",
                 "--speedup", "total", "--timed-new-tokens", "3", "--timing-rounds", "1")  # fmt: skip
    assert main(argv) == 0
    storage = f"sqlite:///{tmp_path / 's' / 'study.db'}"
    trials = [t for t in optuna.load_study(study_name="s", storage=storage).get_trials() if t.values]
    assert trials
    for t in trials:
        record = TrialRecord.from_trial(t)
        assert record is not None and record.speed is not None
        assert t.values[0] == record.speed.speedup  # the objective is the total speedup, the one timed
        assert record.speed.plausible and record.speed.bounds == (1e-3, 1e3)  # the total's wide bounds
        assert str(record.schedule.revival) == "frozen"
    exported = sorted((tmp_path / "s" / "pareto").glob("*.json"))
    assert exported and all(str(Schedule.load(p).revival) == "frozen" for p in exported)
    with pytest.raises(ValueError, match="revival policy = 'sometimes'"):
        SearchSettings(revival="sometimes")
