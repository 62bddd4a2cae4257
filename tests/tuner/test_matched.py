"""The matched-speed comparison: paired bootstrap, speedup at a loss, and the CLI on real LongBench
records with the tiny checkpoint folder (SmolLM2's tokenizer, a random 4-layer Llama)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner import evaluate as evaluate_cli
from tuner.evaluation import ExampleResult
from tuner.matched import Interval, Point, label_of, paired_bootstrap, speedup_at_loss


def _result(dataset: str, i: int, score: float, method: str = "m") -> ExampleResult:
    return ExampleResult(
        dataset=dataset, record_id=str(i), method=method, prediction="", score=score, ttft_s=1.0,
        total_s=1.0, prompt_tokens=10, new_tokens=1, prompt_computed_fraction=1.0, baseline_ttft_s=1.0,
        ttft_speedup=1.0, total_speedup=1.0,
    )  # fmt: skip


def test_paired_bootstrap_difference_and_interval() -> None:
    # dataset a: 4 examples, scores vary a lot; dataset b: 2 examples
    base = [_result("a", i, s) for i, s in enumerate([0.0, 1.0, 0.0, 1.0])] + [
        _result("b", i, s) for i, s in enumerate([0.5, 0.5])
    ]
    # the same predictions: the paired difference is exactly 0 on every draw, however varied the scores
    assert paired_bootstrap(base, base) == Interval(0.0, 0.0, 0.0)
    # one example of a gains a full point: macro difference = (100 * 1/4 + 0) / 2 = 12.5
    better = [_result("a", 0, 1.0), *base[1:]]
    interval = paired_bootstrap(better, base, seed=1)
    assert interval.value == pytest.approx(12.5)
    assert interval.low == pytest.approx(0.0) and 12.5 < interval.high <= 50.0
    assert paired_bootstrap(better, base, seed=1) == interval  # seeded
    with pytest.raises(ValueError, match="same examples"):
        paired_bootstrap([_result("c", 0, 1.0)], base)


def _point(loss: float, flop: float, ttft: float) -> Point:
    return Point(
        label=f"p{flop}", method="gemfilter", options={}, role="sweep", n=3, score=50 - loss,
        vs_baseline=Interval(-loss, -loss, -loss), vs_tuned=None, flop_speedup=flop, ttft_speedup=ttft,
    )  # fmt: skip


def test_speedup_at_loss_interpolates_along_the_curve() -> None:
    curve = [_point(0.0, 1.0, 0.9), _point(2.0, 1.5, 1.4), _point(6.0, 2.5, 2.0)]
    assert speedup_at_loss(curve, 0.0) == pytest.approx(1.0)
    assert speedup_at_loss(curve, 4.0) == pytest.approx(2.0)  # halfway from 1.5 to 2.5
    assert speedup_at_loss(curve, 4.0, "ttft_speedup") == pytest.approx(1.7)
    assert speedup_at_loss(curve, 10.0) == pytest.approx(2.5)
    assert speedup_at_loss(curve, -1.0) is None  # no setting that accurate
    assert label_of("gemfilter", {"r": 2, "k": 0.3}) == "gemfilter_k0.3_r2"


def _argv(tiny_folder: Path, tmp_path: Path, *extra: str) -> list[str]:
    schedule = Schedule.from_layers(str(tiny_folder), 4, {1: 50}).save(tmp_path / "s.json")
    return [
        "--model", str(tiny_folder), "--task", "qa", "--split", "test", "--schedule", str(schedule),
        "--n-examples", "1", "--max-prompt-tokens", "200", "--max-new-tokens", "2",
        "--data-dir", longbench_dir(), "--output", str(tmp_path / "out"), *extra,
    ]  # fmt: skip


def test_match_speedup_cli(tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _argv(
        tiny_folder, tmp_path, "--methods", "baseline,gemfilter,tsp", "--match-speedup",
        "--method-options", "gemfilter.r=2,tsp.layer=1",
    )  # fmt: skip
    assert evaluate_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "Matched speed" in out and "Matched loss" in out
    # the report names each peer's published rule and the schedule's own
    assert "- gemfilter: GemFilter (Shi et al. 2024, arXiv 2409.17422): scoring w1-raw-avg5-sum" in out
    assert "- tsp: TSP of FastKV (Jo et al. 2025, arXiv 2502.01068): scoring w8-softmax-max7-sum" in out
    assert "- tuned schedule: scoring w1-softmax-none-mean" in out
    folder = tmp_path / "out"
    assert (folder / "matched.png").stat().st_size > 0 and (folder / "matched.md").stat().st_size > 0
    rows = list(csv.DictReader((folder / "matched.csv").open()))
    assert [r["role"] for r in rows] == ["tuned"] + (["matched"] + ["sweep"] * 3) * 2
    n = int(rows[0]["n"])
    assert n == 6 and all(int(r["n"]) == n for r in rows)  # one test example of each QA dataset
    target = float(rows[0]["flop_speedup"])
    for r in rows[1:]:
        options = json.loads(r["options"])
        assert options.get("r", 2) == 2 and options.get("layer", 1) == 1  # the fixed knobs stayed
        lo, hi = float(r["delta_vs_baseline_low"]), float(r["delta_vs_baseline_high"])
        assert lo <= float(r["delta_vs_baseline"]) <= hi
        if r["role"] == "matched":
            # matched at the median prompt length; every example's speedup is near the target
            assert float(r["flop_speedup"]) == pytest.approx(target, rel=0.1)
    # the table 1 report holds the baseline only; the peers ran in the matched comparison
    assert {r["method"] for r in csv.DictReader((folder / "report.csv").open())} == {"baseline"}
    # a rerun reuses every cached evaluation
    stamps = {p.name: p.stat().st_mtime_ns for p in (folder / "matched").glob("*.jsonl")}
    assert len(stamps) == 9  # the tuned schedule, and per peer the matched point and 3 sweep points
    assert evaluate_cli.main(argv) == 0
    assert stamps == {p.name: p.stat().st_mtime_ns for p in (folder / "matched").glob("*.jsonl")}
    capsys.readouterr()
    # another schedule invalidates the cache of the tuned point
    Schedule.from_layers(str(tiny_folder), 4, {1: 30}).save(tmp_path / "s.json")
    assert evaluate_cli.main([*argv, "--methods", "baseline,tsp"]) == 0
    assert (folder / "matched" / "lazyllm.jsonl").stat().st_mtime_ns != stamps["lazyllm.jsonl"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method-options", "gemfilter.x=1"], "Unknown option(s) 'x' for method 'gemfilter'. Valid: k, r"),
        (["--method-options", "random.k=0.5"], "method 'random' takes no options"),
        (["--method-options", "gemfilter.k"], "write METHOD.KNOB=VALUE"),
        (["--method-options", "tsp.budget=abc"], "is not a number"),
        (["--method-options", "tsp.budget=2.5"], "give a whole number"),
    ],
)
def test_method_options_are_checked_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    argv = ["--model", str(tmp_path / "no-such-model"), "--methods", "baseline,gemfilter", *extra]
    assert evaluate_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "no-such-model" not in err


def test_peers_need_no_schedule_but_match_speedup_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--model", str(tmp_path / "missing"), "--methods", "baseline,gemfilter,tsp"]
    assert evaluate_cli.main([*argv, "--match-speedup"]) == 2
    assert "--schedule is needed for --match-speedup" in capsys.readouterr().err
    assert evaluate_cli.main([*argv, "--methods", "lazyllm"]) == 2
    assert "--schedule is needed for lazyllm" in capsys.readouterr().err


def test_the_tuned_schedule_is_evaluated_once(tiny_folder: Path, tmp_path: Path) -> None:
    # lazyllm in --methods and the matched comparison's tuned point are the same evaluation
    argv = _argv(tiny_folder, tmp_path, "--methods", "baseline,lazyllm,tsp", "--match-speedup")
    assert evaluate_cli.main(argv) == 0
    folder = tmp_path / "out"
    main = [json.loads(line) for line in (folder / "lazyllm.jsonl").read_text().splitlines()]
    tuned = [json.loads(line) for line in (folder / "matched" / "lazyllm.jsonl").read_text().splitlines()]
    # timings differ between two runs of the same method, so equal timings mean one run
    assert len(main) == len(tuned) == 6 and [r["ttft_s"] for r in main] == [r["ttft_s"] for r in tuned]
