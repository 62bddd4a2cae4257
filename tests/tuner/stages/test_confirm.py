"""tuner.stages.confirm and tuner.study.records: the confirmation stage on a real (tiny) study, and the trial record."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner.evaluation.fidelity import FidelityEvaluator
from tuner.evaluation.losses import BaselineStats, Budget, ScoreLoss
from tuner.evaluation.runner import ExampleResult, macro_score
from tuner.orchestration.session import open_session
from tuner.report.files import write_outcome
from tuner.search import main, parse_settings
from tuner.stages.confirm import (
    Confirmation,
    FreshPrompts,
    candidate_of,
    confirm,
    fresh_kl_of,
    unpruned_score,
)
from tuner.stages.front import fastest_feasible, study_records
from tuner.stages.outcome import StudyOutcome
from tuner.stages.rule import measured_fresh_kl, spread
from tuner.statistics.bootstrap import estimate, macro_weights
from tuner.study.identity import StudyIdentity
from tuner.study.records import TrialRecord
from tuner.study.spaces.base import KEEP_ALL_ATTR


def _argv(folder: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", "hotpotqa,trec", "--n-examples", "2", "--max-prompt-tokens", "96",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "c",
        "--sampler", "random", "--tracking-uri", "none", "--timing-rounds", "2", *extra,
    ]  # fmt: skip


def _raced(folder: Path, out: Path, *, trials: int, k: int, accuracy: str = "score") -> list[str]:
    """A study ranked by the FLOP model, then confirmed: a score search races its candidates on their
    own task-score bounds; a fidelity search (every trial feasible: KL cap 10) certifies by the pooled
    calibration."""
    return _argv(
        folder, out, "--n-trials", str(trials), "--confirm-k", str(k), "--no-heldout", "--max-kl", "10",
        "--speedup", "flops", "--accuracy", accuracy,
        *(["--max-accuracy-loss", "100"] if accuracy == "fidelity" else []),
    )  # fmt: skip


def test_confirmation_recommends_a_confirmed_schedule_and_records_evidence(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _raced(tiny_folder, tmp_path, trials=3, k=2)
    assert main(argv) == 0
    assert "Confirmation (task score on all 4 validation examples" in capsys.readouterr().out
    d = tmp_path / "c"
    data = json.loads((d / "confirmation.json").read_text())
    # the feasible front's fastest k=2 records are the candidates
    assert 1 <= len(data["candidates"]) <= 2 and data["level"] == 0.9 and data["n_examples"] == 4
    assert data["rule"] == "direct" and data["calibration"] is None
    statuses = [c["status"] for c in data["candidates"]]
    # racing: the first confirmed candidate ends it, every later one is skipped
    assert statuses[0] == "confirmed" and all(s == "skipped" for s in statuses[1:])
    speeds = [c["speedup"] for c in data["candidates"]]
    assert speeds == sorted(speeds, reverse=True)
    rec = Schedule.load(d / "recommended.json")
    conf = rec.metadata["confirmation"]
    assert conf["trial"] == data["recommended_trial"] and conf["status"] == "confirmed"
    assert conf["task_loss"]["upper"] <= conf["budget"] and conf["task_loss"]["n"] == 4
    rows = json.loads((d / "pareto.json").read_text())
    assert all("confirmation" in r and "accuracy_loss_upper" in r for r in rows)
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    assert study.user_attrs["confirmation"] == data and data["complete_trials"] == 3
    # a score search's feasibility is the race's own bound: the fastest feasible record is confirmed
    # on the evidence it already has, so a larger k gives no candidate another draw
    records = study_records(study)
    fastest = fastest_feasible(records, StudyOutcome.from_study(study).search_loss)
    assert fastest is not None and data["recommended_trial"] == fastest.number
    assert fastest.loss is not None and data["candidates"][0]["task_loss"]["upper"] == fastest.loss.upper
    assert [r["trial"] for r in rows if r["recommended"]] == [data["recommended_trial"]]

    # the same study against a baseline that scored perfectly: every candidate loses 100 points
    settings = parse_settings(argv)
    session = open_session(settings, progress=False)
    perfect = tuple(dataclasses.replace(b, score=1.0) for b in session.runner.baseline.results)
    session.runner.baseline = BaselineStats.of(perfect)
    session.runner.loss = ScoreLoss(2.0)
    # records that do not cover every example are scored again (against the perfect baseline)
    partial = [dataclasses.replace(r, per_example={}) for r in study_records(study)]
    failed = confirm(partial, session.runner, 2, complete_trials=3)
    assert failed.recommended is None and {c.status for c in failed.candidates} == {"failed"}
    assert all("budget" in c.reason for c in failed.candidates)
    outcome = dataclasses.replace(StudyOutcome.from_study(study, _budget(study, 2.0)), confirmation=failed)
    write_outcome(outcome, d)
    assert not (d / "recommended.json").exists()
    rows = json.loads((d / "pareto.json").read_text())
    assert {r["confirmation"] for r in rows} <= {"failed", "not a candidate"}
    assert not any(r["recommended"] for r in rows)


def test_everything_names_the_confirmed_trial_when_the_fastest_fails(
    tiny_folder: Path, tmp_path: Path
) -> None:
    assert main(_raced(tiny_folder, tmp_path, trials=3, k=0, accuracy="fidelity")) == 0
    d = tmp_path / "c"
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    fastest = StudyOutcome.from_study(study, _budget(study, 2.0)).recommended
    assert fastest is not None
    # a confirmation in which the fastest front candidate failed and the next one was confirmed
    first, second = StudyOutcome.from_study(study, _budget(study, 2.0)).front[:2]
    assert first.number == fastest.number
    rejected = Confirmation(
        2.0,
        0.9,
        (candidate_of(first, "failed", None, "over"), candidate_of(second, "confirmed", None, "ok")),
        4,
        3,
    )
    rejected.store(study)
    write_outcome(
        StudyOutcome.from_study(study, _budget(study, 2.0)), d
    )  # as tuner.export does: the stored pick
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    picked = StudyOutcome.from_study(study, _budget(study, 2.0)).recommended
    assert picked is not None and picked.number == second.number != fastest.number
    rows = json.loads((d / "pareto.json").read_text())
    assert [r["trial"] for r in rows if r["recommended"]] == [second.number]
    assert Schedule.load(d / "recommended.json").metadata["trial"] == second.number
    # a later trial makes the confirmation stale: back to the fastest feasible until it is rerun
    study.enqueue_trial({}, user_attrs={KEEP_ALL_ATTR: True})  # keep-all again: refused, a fresh draw runs
    assert main(_raced(tiny_folder, tmp_path, trials=4, k=0, accuracy="fidelity")) == 0
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    assert Confirmation.of_study(study) is None
    again = StudyOutcome.from_study(study, _budget(study, 2.0))
    best = fastest_feasible(again.records, again.search_loss)
    assert again.provisional and again.recommended is not None and again.recommended == best
    assert best is not None and best.values[0] >= fastest.values[0]
    assert Schedule.load(d / "recommended.json").metadata["status"] == "provisional"


def test_a_fidelity_search_is_certified_by_the_pooled_calibration(tiny_folder: Path, tmp_path: Path) -> None:
    assert main(_raced(tiny_folder, tmp_path, trials=4, k=2, accuracy="fidelity")) == 0
    d = tmp_path / "c"
    data = json.loads((d / "confirmation.json").read_text())
    assert data["rule"] == "pooled" and {c["status"] for c in data["candidates"]} <= {"confirmed", "scored"}
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    outcome = StudyOutcome.from_study(study)
    conf = outcome.confirmation
    assert conf is not None and conf.calibration is not None
    scored = [c for c in conf.candidates if c.loss is not None]
    assert 1 <= len(scored) <= 2 and set(conf.calibration.trials) == {c.trial for c in scored}
    best = outcome.recommended
    assert best is not None and best.number == data["recommended_trial"]
    # the pick is the fastest front schedule whose predicted bound is within budget, not past the evidence
    for r in outcome.front:
        _, up = conf.calibration.predicted(r.values[1])
        ok = r.values[1] == 0 or (up <= 100 and r.values[1] <= conf.calibration.max_scored_kl)
        if r.values[0] > best.values[0]:
            assert not ok, r.number
        if r.number == best.number:
            assert ok
    # the same evidence against a baseline that scored perfectly: every example loses 100 points, so
    # a slope of ~100/KL points per nat puts every drifting schedule far over a 2-point budget
    session = open_session(
        parse_settings(_raced(tiny_folder, tmp_path, trials=4, k=2, accuracy="fidelity")), progress=False
    )
    session.runner.baseline = BaselineStats.of(
        tuple(dataclasses.replace(b, score=1.0) for b in session.runner.baseline.results)
    )
    session.runner.budget = session.runner.budget.with_task(2.0)  # the typed budget every stage reads
    strict = confirm(study_records(study), session.runner, 2, complete_trials=4)
    assert strict.rule == "pooled" and strict.calibration is not None and strict.calibration.slope > 1000
    rec = strict.recommended
    assert rec is None or rec.search_loss == 0.0  # only a schedule without drift can pass


def test_trial_record_round_trip_and_feasibility(tiny_folder: Path, tmp_path: Path) -> None:
    assert (
        main(
            _argv(
                tiny_folder,
                tmp_path,
                "--n-trials",
                "2",
                "--confirm-k",
                "0",
                "--no-heldout",
                "--max-kl",
                "0.05",
                "--speedup",
                "measured",
            )
        )
        == 0
    )
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{tmp_path / 'c' / 'study.db'}")
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):  # the peers' warm starts wait
        record = TrialRecord.from_trial(t)
        assert record is not None and TrialRecord.from_dict(record.to_dict()) == record
        assert record.accuracy == "fidelity" and record.loss.n == 4 and len(record.per_example) == 4
        assert record.speed is not None and record.speed.rounds >= 2 and record.loss is not None
        assert record.values == tuple(t.values)
        # the constraint the samplers see is the one-sided upper bound minus the budget
        assert t.constraints["accuracy_loss"] == record.loss.upper - 0.05
        flat = record.flat_metrics()
        assert {"accuracy_loss_upper", "accuracy_loss_low", "top1", "flop_speedup"} <= set(flat)
    second = TrialRecord.from_trial(study.trials[1])
    assert second is not None and second.loss is not None
    assert second.loss.upper > second.loss.value  # so the bound is what is used
    pruned = second
    with pytest.raises(ValueError, match="accuracy"):
        dataclasses.replace(pruned, accuracy="bogus")


@pytest.mark.parametrize("n", range(0, 13))
@pytest.mark.parametrize("k", [1, 2, 3, 6])
def test_spread_takes_the_fastest_and_the_slowest_evenly_and_nothing_twice(n: int, k: int) -> None:
    """The calibration's scored schedules: up to ``k`` distinct front members (fastest first), the
    fastest always, the slowest too when two or more are taken, gaps between picks differing by at
    most one position."""
    front = list(range(n))  # fastest first
    picks = spread(front, k)
    assert picks == sorted(set(picks)), picks
    assert len(picks) == min(n, k)
    if n:
        assert picks[0] == 0
    if n and k >= 2:
        assert picks[-1] == n - 1
    gaps = [b - a for a, b in itertools.pairwise(picks)]
    assert not gaps or max(gaps) - min(gaps) <= 1, gaps


def _budget(study: optuna.Study, points: float) -> Budget:
    """The study's own search cap with a task budget of ``points`` (as ``tuner.export --max-accuracy-loss``)."""
    identity = StudyIdentity.of_study(study)
    assert identity is not None
    return Budget.from_settings(identity).with_task(points)


def test_the_calibration_can_rest_on_more_examples_than_the_search(tiny_folder: Path, tmp_path: Path) -> None:
    """--confirm-n-examples: the search runs on 2 examples per dataset, the scored schedules (task
    score and KL) on up to 4 per dataset, and the calibration and the confirmation count those."""
    argv = _raced(tiny_folder, tmp_path, trials=4, k=2, accuracy="fidelity")
    assert main([*argv, "--confirm-n-examples", "4"]) == 0
    data = json.loads((tmp_path / "c" / "confirmation.json").read_text())
    assert data["rule"] == "pooled" and data["calibration"] is not None
    assert data["n_examples"] > 4 and data["calibration"]["n_examples"] == data["n_examples"]
    scored = [c for c in data["candidates"] if c["task_loss"] is not None]
    assert scored and all(c["task_loss"]["n"] == data["n_examples"] for c in scored)


def _open_qa(folder: Path) -> Path:
    from tests.tuner.data.test_openqa import _hotpot, _squad
    from tuner.data.openqa import FILES

    folder.mkdir()
    (folder / FILES["hotpotqa-long"]).write_text(json.dumps(_hotpot()))
    (folder / FILES["squad-long"]).write_text(json.dumps(_squad()))
    return folder


def test_an_underpowered_study_rechecks_its_front_on_fresh_open_qa_prompts(
    tiny_folder: Path, tmp_path: Path
) -> None:
    """Step 5 of the rule on a real study: with no slope prior the calibration is underpowered, so the
    fastest front schedule that passes at its validation KL is measured again on open-QA prompts the
    search never saw; what the confirmation stores is that schedule's KL there, recomputed equal."""
    data = _open_qa(tmp_path / "open-qa")
    argv = [
        *_raced(tiny_folder, tmp_path, trials=4, k=2, accuracy="fidelity"), "--max-prompt-tokens", "300",
        "--slope-prior", "none", "--openqa-dir", str(data), "--fresh-kl-examples", "3",
    ]  # fmt: skip
    assert main(argv) == 0
    d = tmp_path / "c"
    fresh = json.loads((d / "confirmation.json").read_text())["fresh"]
    assert fresh["n_examples"] == 6 and fresh["prompts"] == "open-QA validation (3 per dataset, 300 tokens)"
    settings = parse_settings(argv)
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    outcome = StudyOutcome.from_study(study)
    best = outcome.recommended
    assert best is not None and best.values[1] > 0  # a budget of 100 points: the fastest drifting one
    assert [t for t, _ in fresh["kl"]] == [best.number]  # passed there too: nothing slower is asked
    session = open_session(settings, progress=False)
    fresh_settings = settings.fresh_source().settings
    assert fresh_settings is not None and fresh_settings.task == "openqa"
    there = session.runner.on(fresh_settings)
    assert {ex.dataset for ex in there.evaluator.examples} == {"hotpotqa-long", "squad-long"}
    drifts, _ = there.fidelity.evaluate(there.engine(best.schedule))
    assert fresh["kl"][0][1] == pytest.approx(sum(x.kl for x in drifts) / len(drifts), rel=1e-6)
    assert fresh["kl"][0][1] != pytest.approx(best.values[1], rel=1e-3)  # other prompts, another KL
    datasets = [x.dataset for x in drifts]  # its bound: the prompts resampled within each dataset
    bound = measured_fresh_kl([x.kl for x in drifts], macro_weights(datasets), datasets, 0.9).upper
    assert fresh["upper"] == [[best.number, pytest.approx(bound, rel=1e-6)]]
    paragraph = Schedule.load(d / "recommended.json").metadata["decision"]
    assert "re-measured its front's KL on 6 prompts the search never saw" in paragraph
    # without a local open-QA folder the check reads the pool packaged with the project
    other = tmp_path / "other"
    assert main([*argv[: argv.index("--openqa-dir")], "--output", str(other)]) == 0
    kept = json.loads((other / "c" / "confirmation.json").read_text())["fresh"]
    assert kept["prompts"] == "open-QA validation (the packaged pool, 12 per dataset, 300 tokens)"
    assert kept["n_examples"] == 24 and kept["kl"]  # --fresh-kl-examples went with --openqa-dir
    # a search on as many examples as the check holds is checked all the same: the check is for the
    # selection on the examples that ranked the front, not for their number (docs/statistics.md)
    few = tmp_path / "few"
    assert main([*argv[:-1], "2", "--output", str(few)]) == 0
    as_many = json.loads((few / "c" / "confirmation.json").read_text())["fresh"]
    assert len(session.runner.evaluator.examples) >= as_many["n_examples"] == 4
    assert as_many["prompts"] == "open-QA validation (2 per dataset, 300 tokens)" and as_many["kl"]


def test_an_open_qa_search_rechecks_its_front_on_the_calibration_examples_it_did_not_see(
    tiny_folder: Path, tmp_path: Path
) -> None:
    """Step 5 for a search on open-QA: the fresh prompts are the calibration's validation examples
    beyond the search's (a schedule chosen on 24 examples drifted 2.2 times as much on the next 24),
    --fresh-kl-examples per dataset; the KL stored is that schedule's KL there, recomputed equal."""
    data = _open_qa(tmp_path / "open-qa")
    argv = [
        *_raced(tiny_folder, tmp_path, trials=4, k=2, accuracy="fidelity"), "--max-prompt-tokens", "300",
        "--task", "openqa", "--openqa-dir", str(data), "--n-examples", "1", "--confirm-n-examples", "3",
        "--slope-prior", "none", "--fresh-kl-examples", "2",
    ]  # fmt: skip
    assert main(argv) == 0
    d = tmp_path / "c"
    fresh = json.loads((d / "confirmation.json").read_text())["fresh"]
    assert fresh["prompts"] == "open-QA validation beyond the search's (2 per dataset, 300 tokens)"
    assert fresh["n_examples"] == 4 and len(fresh["kl"]) >= 1
    settings = parse_settings(argv)
    session = open_session(settings, progress=False)
    search = {ex.key for ex in session.runner.evaluator.examples}
    calibration = session.runner.fidelity_on(settings.evidence_settings("confirm"))
    beyond = [ex for ex in calibration.evaluator.examples if ex.key not in search]
    per: dict[str, list[Any]] = {}
    for ex in beyond:
        per.setdefault(ex.dataset, []).append(ex)
    prompts = [ex for exs in per.values() for ex in exs[:2]]
    assert len(prompts) == 4 and not search & {ex.key for ex in prompts}
    study = optuna.load_study(study_name="c", storage=f"sqlite:///{d / 'study.db'}")
    first, kl = fresh["kl"][0]
    record = next(r for r in StudyOutcome.from_study(study).records if r.number == first)
    there = FidelityEvaluator(calibration.evaluator.restricted(prompts))
    engine = session.runner.engine(record.schedule)
    drifts, _ = there.evaluate(engine)
    measured = dict(map(tuple, fresh["stopped"])).get(first, 4)  # type: ignore[arg-type]
    assert kl == pytest.approx(sum(x.kl for x in drifts[:measured]) / len(drifts), rel=1e-6)
    # the measurer stops once its KL so far, the rest counted at 0, is refused; else it reads all
    weights = {ex.key: 1.0 for ex in prompts}
    on = FreshPrompts(there, weights, "the 4 prompts")
    assert drifts[0].kl > 0
    none, read = fresh_kl_of(on, engine, lambda at: True, 0.9)  # refused at its own KL: no prompt read
    assert (none.kl, none.complete, none.upper, read) == (0.0, False, None, 0)
    one, read = fresh_kl_of(on, engine, lambda at: at > 0, 0.9)
    assert one.kl == pytest.approx(drifts[0].kl / 4, rel=1e-6) and read == 1
    assert not one.complete and one.upper is None  # a lower bound has no sampling bound
    every, read = fresh_kl_of(on, engine, lambda at: False, 0.9)
    assert every.kl == pytest.approx(sum(x.kl for x in drifts) / 4, rel=1e-6) and read == 4
    # the mean's one-sided bound at 90%, resampling prompts within each dataset
    expect = estimate([x.kl for x in drifts], [1.0] * 4, strata=[x.dataset for x in drifts], level=0.9)
    assert every.complete and every.upper == pytest.approx(max(expect.upper, every.kl))
    assert every.upper is not None and (every.upper > every.kl or len({x.kl for x in drifts}) == 1)
    # the stored check: a bound for each trial measured on every prompt, none for a stopped one
    stopped = {t for t, _ in fresh["stopped"]}
    assert {t for t, _ in fresh["upper"]} == {t for t, _ in fresh["kl"]} - stopped
    assert all(up >= dict(map(tuple, fresh["kl"]))[t] for t, up in fresh["upper"])  # type: ignore[arg-type]
    # a calibration on the search's own examples has nothing beyond them
    same = tmp_path / "same"
    assert main([*argv[: argv.index("--confirm-n-examples")], "--output", str(same)]) == 0
    kept = json.loads((same / "c" / "confirmation.json").read_text())["fresh"]
    assert kept["n_examples"] == 0 and kept["prompts"].startswith("not available: the calibration's examples")


def test_the_unpruned_score_a_prior_is_read_at_is_the_macro_score_with_its_bound() -> None:
    """What confirm hands the rule: the unpruned model's macro score on the calibration's examples (the
    number the report prints) with its bound at --confidence."""
    scores = [("a", 0.0), ("a", 0.5), ("a", 0.0), ("a", 0.3), ("a", 0.0)]
    scores += [("b", 0.2), ("b", 0.0), ("b", 0.4), ("b", 0.0), ("b", 0.1), ("b", 0.0)]
    rows = [
        ExampleResult(d, f"r{i}", "baseline", "", s, 0.1, 0.2, 100, 4, 1.0) for i, (d, s) in enumerate(scores)
    ]
    score = unpruned_score(rows, 0.9)
    assert score.value == pytest.approx(macro_score(rows)) and (score.n, score.level) == (11, 0.9)
    points, weights = [100.0 * s for _, s in scores], macro_weights([d for d, _ in scores])
    assert (
        score.upper == pytest.approx(estimate(points, weights, level=0.9).upper) and score.upper > score.value
    )


def test_a_study_reads_a_scaled_prior_at_its_unpruned_scores_bound(tiny_folder: Path, tmp_path: Path) -> None:
    """A real (tiny) study with a prior that scales by the unpruned score: the confirmation records the
    score it measured on the calibration's examples and its bound, which the certified bound and, by
    default, the bound that decides were read at (--no-prior-at-score-bound: that one at the score)."""
    from tuner.statistics.prior import PRIOR_DIR

    packaged = json.loads((PRIOR_DIR / "smollm2-135m-1024-p0.5.json").read_text())  # scales by the score
    prior = tmp_path / "tiny-prior.json"
    prior.write_text(json.dumps({**packaged, "model": tiny_folder.name.lower()}))
    argv = [*_raced(tiny_folder, tmp_path, trials=4, k=2, accuracy="fidelity"), "--slope-prior", str(prior)]
    assert main(argv) == 0
    floor = json.loads((tmp_path / "c" / "confirmation.json").read_text())["calibration"]["floor"]
    assert packaged["scaling"] == "baseline" and floor["baseline_score"] is not None
    assert floor["baseline_upper_confidence"] is not None
    assert floor["baseline_score"] <= floor["baseline_upper_confidence"]
    assert floor["decided_at_bound"] is True
    from tuner.statistics.prior import SlopePrior

    loaded = SlopePrior.load(prior)
    at = loaded.scale(floor["baseline_upper_confidence"]) * loaded.upper(0.6)
    assert floor["prior_upper"] == pytest.approx(at)
    argv = [
        *_raced(tiny_folder, tmp_path / "p", trials=4, k=2, accuracy="fidelity"),
        "--slope-prior",
        str(prior),
    ]
    assert main([*argv, "--no-prior-at-score-bound"]) == 0
    point = json.loads((tmp_path / "p" / "c" / "confirmation.json").read_text())["calibration"]["floor"]
    assert point["decided_at_bound"] is False
    assert point["prior_upper"] == pytest.approx(loaded.scale(point["baseline_score"]) * loaded.upper(0.6))
