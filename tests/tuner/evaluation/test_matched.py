"""The matched-speed comparison: paired bootstrap, speedup at a loss, and the CLI on real LongBench
records with the tiny checkpoint folder (SmolLM2's tokenizer, a random 4-layer Llama)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from lazyllm.flops import ModelDims
from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner import evaluate as evaluate_cli
from tuner.evaluation.matched import Evaluated, MatchRequest, Point, compare, label_of, speedup_at_loss
from tuner.evaluation.runner import ExampleResult, MethodSpeed, summarize
from tuner.report.evaluation import loss_table
from tuner.report.matched import markdown
from tuner.statistics.bootstrap import Estimate
from tuner.statistics.speed import SpeedMeasurement

NUMBER = r"[-+]?\d+\.\d+"


def _result(dataset: str, i: int, score: float, method: str = "m") -> ExampleResult:
    return ExampleResult(
        dataset=dataset, record_id=str(i), method=method, prediction="", score=score, ttft_s=1.0,
        total_s=1.0, prompt_tokens=10, new_tokens=1, prompt_computed_fraction=1.0,
    )  # fmt: skip


def _speed(ratio: float) -> MethodSpeed:
    def one() -> SpeedMeasurement:
        return SpeedMeasurement(ratio, 1.0, (ratio, ratio), (1.0, 1.0), False, True, clock="cpu")

    return MethodSpeed("a/0", 10, 1, one(), one())


def test_the_report_shows_one_interval_per_schedule() -> None:
    """Table 3 and the matched-speed table print the same loss and interval for the tuned schedule
    (on main they were two bootstraps: 90% macro loss vs 95% within-dataset score change)."""
    scores = [0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.25, 1.0]
    base = [_result("a" if i < 8 else "b", i, s) for i, s in enumerate(scores)]
    tuned = [_result(r.dataset, int(r.record_id), s) for r, s in zip(base, [0.0, 1.0, 0.0, 0.0, 1.0, 0.0,
             1.0, 0.0, 0.5, 0.25, 0.25, 1.0])]  # fmt: skip
    table3 = loss_table({"lazyllm": summarize(tuned, base, _speed(1.2))})
    dims = ModelDims(
        hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=100, windows=(None,) * 4
    )
    request = MatchRequest(
        tuple(base), Schedule.from_layers("m", 4, {1: 50}), dims, (10,) * len(base), peers=()
    )
    report = compare(lambda method, options: Evaluated(tuned, _speed(1.2)), request)
    matched_md = markdown(report, "header")
    row3 = next(line for line in table3.splitlines() if line.startswith("| lazyllm |"))
    loss, low, high, _upper = (float(x) for x in re.findall(NUMBER, row3))
    row_m = next(line for line in matched_md.splitlines() if line.startswith("| tuned schedule (lazyllm) |"))
    value, m_low, m_high = (float(x) for x in re.findall(NUMBER, row_m.split("|")[5]))
    assert loss > 0 and low < high  # the tuned schedule lost points; the interval is not degenerate
    assert (value, m_low, m_high) == (loss, low, high)
    assert "90% paired bootstrap" in table3 and "90% paired bootstrap" in matched_md
    assert "clock cpu" in matched_md


def _point(loss: float, flop: float, ttft: float) -> Point:
    return Point(
        label=f"p{flop}", method="gemfilter", options={}, role="sweep", n=3, score=50 - loss,
        vs_baseline=Estimate(loss, 0.0, loss, loss, loss, 0.9, 3), vs_tuned=None, flop_speedup=flop,
        ttft_speedup=ttft,
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
        lo, hi = float(r["loss_vs_baseline_low"]), float(r["loss_vs_baseline_high"])
        assert lo <= float(r["loss_vs_baseline"]) <= hi
        assert r["timing_clock"] == "cpu" and int(r["timing_rounds"]) >= 3  # tuner.statistics.speed, on a CPU
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
    # and the report gives it one loss interval: Table 3's is the matched table's
    summary = json.loads((folder / "lazyllm.summary.json").read_text())
    low, high = summary["accuracy_loss_interval"]
    row = next(
        x for x in (folder / "matched.md").read_text().splitlines() if x.startswith("| tuned schedule")
    )
    assert f"| {summary['accuracy_loss']:+.2f} [{low:+.2f}, {high:+.2f}] |" in row


def test_a_match_request_names_a_peer_without_a_size_knob_before_anything_runs() -> None:
    dims = ModelDims(
        hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=100, windows=(None,) * 4
    )
    base = (_result("a", 0, 1.0),)
    schedule = Schedule.from_layers("m", 4, {1: 50})
    with pytest.raises(ValueError, match="method 'random' has no size knob to match; peers: "):
        MatchRequest(base, schedule, dims, (10,), peers=("random",))
    with pytest.raises(ValueError, match="no prompt lengths"):
        MatchRequest(base, schedule, dims, ())
    assert MatchRequest(base, schedule, dims, (10, 30, 50)).median_length == 30
