"""Evaluation on real LongBench records with a tiny random model and SmolLM2's real tokenizer."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from lazyllm.methods import make_method
from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner import evaluate as evaluate_cli
from tuner.evaluation import runner
from tuner.evaluation.runner import Evaluator, build_examples, run_example, summarize
from tuner.report.evaluation import write_method
from tuner.study.settings import EvalSettings


@pytest.fixture(scope="module")
def loaded(tiny_folder: Path) -> tuple[Any, Any]:
    from lazyllm.models import load_model

    return load_model(str(tiny_folder), device="cpu")


def config(**kw: Any) -> EvalSettings:
    base: dict[str, Any] = dict(
        task="qa", n_examples=1, max_prompt_tokens=256, max_new_tokens=4, data_dir=longbench_dir()
    )
    return EvalSettings(**{**base, **kw})


def test_examples_follow_longbench_rules(loaded: tuple[Any, Any]) -> None:
    _, tokenizer = loaded
    examples = build_examples(
        config(task="trec,samsum,hotpotqa", n_examples=2, max_new_tokens=None), tokenizer
    )
    assert [e.dataset for e in examples] == ["trec", "trec", "samsum", "samsum", "hotpotqa", "hotpotqa"]
    for e in examples:
        assert len(e.input_ids) <= 256
    text = {e.dataset: tokenizer.decode(list(e.input_ids)) for e in examples}
    assert "<|im_start|>" not in text["trec"] and "<|im_start|>" not in text["samsum"]  # no chat template
    assert "<|im_start|>user" in text["hotpotqa"]
    assert {e.dataset: e.stop_strings for e in examples}["samsum"] == ("\n",)
    assert {e.dataset: e.max_new_tokens for e in examples} == {"trec": 64, "samsum": 128, "hotpotqa": 32}
    with pytest.raises(ValueError, match="Unknown task 'nope'"):
        build_examples(config(task="nope"), tokenizer)


def test_keep_all_lazyllm_equals_baseline_and_cache_is_reused(
    loaded: tuple[Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tokenizer = loaded
    evaluator = Evaluator(model, tokenizer, config(), tmp_path, progress=False)
    baseline = evaluator.baseline_results()
    assert len(baseline) == 6  # one validation example per QA dataset
    keep_all = Schedule.keep_all(str(tiny_path(model)), 4)
    results, reason = evaluator.evaluate("lazyllm", make_method("lazyllm", model, tokenizer, keep_all))
    assert reason is None
    assert [r.prediction for r in results] == [b.prediction for b in baseline]
    summary = summarize(results, baseline)
    assert summary.loss.value == 0.0 and summary.n_examples == 6
    assert all(r.ttft_s > 0 and r.total_s > 0 for r in results)

    # a second evaluator finds everything in the cache and never runs the baseline again
    again = Evaluator(model, tokenizer, config(), tmp_path, progress=False)

    def fail(*a: Any, **k: Any) -> Any:
        raise AssertionError("baseline recomputed")

    again.baseline_engine.generate = fail  # type: ignore[method-assign]
    monkeypatch.setattr(runner, "run_examples", fail)  # the batched path too
    assert [b.prediction for b in again.baseline_results()] == [b.prediction for b in baseline]
    # a different truncation is a different cache entry
    other = Evaluator(model, tokenizer, config(max_prompt_tokens=128), tmp_path, progress=False)
    assert other.cache.path != again.cache.path


def test_a_frozen_schedule_decodes_its_examples_together_with_the_answers_of_one_at_a_time(
    loaded: tuple[Any, Any], tmp_path: Path
) -> None:
    model, tokenizer = loaded
    evaluator = Evaluator(model, tokenizer, config(max_new_tokens=12), tmp_path, progress=False)
    frozen = Schedule.from_layers(tiny_path(model), 4, {1: 50}).with_revival("frozen")
    engine = make_method("lazyllm", model, tokenizer, frozen)
    results, _ = evaluator.evaluate("lazyllm", engine)
    alone = [run_example(engine, ex) for ex in evaluator.examples]
    assert [r.prediction for r in results] == [a.text for a in alone]
    assert [r.new_tokens for r in results] == [len(a.token_ids) for a in alone]
    assert len({len(ex.input_ids) for ex in evaluator.examples}) > 1  # padded to the longest
    base = evaluator.baseline()
    assert [base[ex.key].token_ids for ex in evaluator.examples] == [
        tuple(run_example(evaluator.baseline_engine, ex).token_ids) for ex in evaluator.examples
    ]


def test_force_own_carries_the_logits_forced_along_each_runs_own_answer(
    loaded: tuple[Any, Any], tmp_path: Path
) -> None:
    import torch

    model, tokenizer = loaded
    evaluator = Evaluator(model, tokenizer, config(max_new_tokens=6), tmp_path, progress=False)
    pruned = Schedule.from_layers(tiny_path(model), 4, {1: 50})
    frozen = make_method("lazyllm", model, tokenizer, pruned.with_revival("frozen"))
    reviving = make_method("lazyllm", model, tokenizer, pruned.with_revival("dynamic"))
    examples = evaluator.examples[:2]
    runs = [(engine, ex, None) for engine in (frozen, reviving) for ex in examples]  # batched, then alone
    results = runner.run_examples(runs, force_own=True)
    for (engine, ex, _), result in zip(runs, results):
        assert result.forced_logits is not None
        expected = engine.forced_logits(torch.tensor(ex.input_ids), list(result.token_ids))
        assert torch.allclose(result.forced_logits, expected, atol=1e-4)
    with pytest.raises(ValueError, match="not both"):
        runner.run_examples(runs, forced=[(1,)] * len(runs), force_own=True)


def tiny_path(model: Any) -> str:
    return str(model.config.name_or_path)


def test_speed_is_measured_by_tuner_speed_and_keep_all_is_about_1x(
    loaded: tuple[Any, Any], tmp_path: Path
) -> None:
    model, tokenizer = loaded
    evaluator = Evaluator(model, tokenizer, config(), tmp_path, progress=False)
    lengths = sorted(len(e.input_ids) for e in evaluator.examples)
    timing = evaluator.timing_example()
    assert len(timing.input_ids) in lengths[2:4]  # the example of median prompt length (6 examples)
    keep_all = make_method("lazyllm", model, tokenizer, Schedule.keep_all(tiny_path(model), 4))
    speed = evaluator.measure_speed(keep_all, timing, 1.0, rounds=3)
    assert speed.clock == "cpu" and speed.example == timing.key  # auto = the thread clock on a CPU
    for m in (speed.ttft, speed.total):
        assert m.rounds >= 3 and len(m.schedule_s) == m.rounds  # interleaved rounds, every timing kept
        assert m.speedup == min(m.baseline_s) / min(m.schedule_s)  # minimum per side
        # keep-all does the unpruned work: no real speedup or slowdown. Time is the property here, so the
        # bound is wide: the thread clock ignores waiting for the CPU, but other processes still move
        # this thread's cache and clock speed; a side timed doing nothing would be far outside it
        assert 0.25 <= m.speedup <= 4.0
    with pytest.raises(ValueError, match="timing clock = 'nope'"):
        evaluator.measure_speed(keep_all, timing, 1.0, clock="nope")


def test_early_stop_and_overwrite(loaded: tuple[Any, Any], tmp_path: Path) -> None:
    model, tokenizer = loaded
    evaluator = Evaluator(model, tokenizer, config(), tmp_path, progress=False)
    schedule = Schedule.from_layers(tiny_path(model), 4, {1: 50})
    results, reason = evaluator.evaluate(
        "lazyllm",
        make_method("lazyllm", model, tokenizer, schedule),
        should_stop=lambda rs: "enough" if len(rs) >= 2 else None,
    )
    assert reason == "enough" and len(results) == 2
    summary = summarize(results, evaluator.baseline_results())
    assert summary.n_examples == 2 and set(summary.dataset_scores) == {
        results[0].dataset,
        results[1].dataset,
    }
    for _ in range(2):
        write_method(results, summary, tmp_path / "out", "lazyllm")
    lines = (tmp_path / "out" / "lazyllm.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["method"] == "lazyllm"


def test_report_cli(tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schedule = Schedule.from_layers(str(tiny_folder), 4, {1: 50}).save(tmp_path / "s.json")
    argv = [
        "--model", str(tiny_folder), "--task", "qa", "--split", "test", "--schedule", str(schedule),
        "--methods", "baseline,lazyllm,random,static,compression", "--n-examples", "1",
        "--max-prompt-tokens", "200", "--max-new-tokens", "3", "--data-dir", longbench_dir(),
        "--output", str(tmp_path / "report"),
    ]  # fmt: skip
    assert evaluate_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "Table 1" in out and "Table 2" in out and "single-doc-qa (n=3)" in out and "multi-doc-qa (n=3)" in out
    )
    for name in ("report.md", "report.csv", "report.png", "lazyllm.jsonl", "static.summary.json"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    # every method's loss is printed with its interval and sample count, as in its summary
    summary = json.loads((tmp_path / "report" / "static.summary.json").read_text())
    low, high = summary["accuracy_loss_interval"]
    row = f"| static | 6 | {summary['accuracy_loss']:.2f} | [{low:.2f}, {high:.2f}] | {summary['accuracy_loss_upper']:.2f} |"
    assert "Table 3" in out and row in out and "| baseline | 6 |" not in out
    # speedups come from tuner.statistics.speed, and the report says on which clock and with how many rounds
    speed = summary["speed"]
    assert speed["clock"] == summary["timing_clock"] == "cpu" and speed["ttft"]["rounds"] >= 3
    assert summary["ttft_speedup"] == min(speed["ttft"]["baseline_s"]) / min(speed["ttft"]["schedule_s"])
    assert "clock cpu" in out and "interleaved rounds per side" in out
    rows = list(csv.DictReader((tmp_path / "report" / "report.csv").open()))
    assert {r["timing_clock"] for r in rows if r["method"] != "baseline"} == {"cpu"}
    assert evaluate_cli.main([*argv[:-2], "--output", str(tmp_path / "report"), "--methods", "bogus"]) == 2
    assert "Unknown method 'bogus'" in capsys.readouterr().err


def test_method_speed_round_trips_through_json() -> None:
    """The matched-speed cache stores each point's timing as JSON and reads it back unchanged."""
    from tuner.evaluation.runner import MethodSpeed
    from tuner.statistics.speed import measure_speedup

    base, pruned = iter([2.0, 2.2, 2.1]), iter([1.1, 1.0, 1.3])
    ttft = measure_speedup(lambda: next(base), lambda: next(pruned), 2.0, rounds=3, clock="cpu")
    total = measure_speedup(lambda: 3.0, lambda: 2.0, 1.5, rounds=2, clock="cpu")
    speed = MethodSpeed("qasper/7", 480, 32, ttft, total)
    assert MethodSpeed.from_dict(json.loads(json.dumps(speed.to_dict()))) == speed
    assert speed.ttft.speedup == 2.0 / 1.0 and speed.clock == "cpu" and speed.ttft.rounds == 3


def test_summary_is_one_record_that_round_trips_through_its_json() -> None:
    """``<method>.summary.json`` is :meth:`EvaluationSummary.to_dict`; its loader reads it back equal."""
    from tuner.evaluation.runner import EvaluationSummary, ExampleResult

    def row(ds: str, i: int, score: float, m: str) -> ExampleResult:
        return ExampleResult(ds, str(i), m, "", score, 1.0, 1.0, 10, 1, 0.5 if m == "x" else 1.0)

    base = [row("hotpotqa" if i < 3 else "qasper", i, s, "b") for i, s in enumerate([1, 0.5, 0, 1, 1, 0])]
    pruned = [row(b.dataset, int(b.record_id), b.score / 2, "x") for b in base]
    summary = summarize(pruned, base)
    data = json.loads(json.dumps(summary.to_dict()))
    assert EvaluationSummary.from_dict(data) == summary
    assert data["accuracy_loss"] == summary.loss.value and data["n_examples"] == 6 and "speed" not in data
    # per dataset: hotpotqa 50 -> 25, qasper 66.67 -> 33.33 (LongBench scores round to 2 digits)
    assert summary.dataset_losses() == pytest.approx({"hotpotqa": 25.0, "qasper": 33.34})
    assert summary.prompt_computed_pct == 50.0
    with pytest.raises(ValueError, match="datasets differ"):
        EvaluationSummary.from_dict({**data, "baseline_dataset_scores": {"hotpotqa": 50.0}})
