"""tuner.stages.target: a multi-fidelity search runs its trials on short prompts and decides at the target.

Two real studies on a tiny random model (no mocks): one whose trials run at the target length, one whose
trials run on prompts half as long. The warm starts are the same schedules in both, so the full-length
study's trial KLs are an independent measurement of what the multi-fidelity study's decision must read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna
import pytest

from tests.support import hand_record, longbench_dir
from tuner.evaluation.losses import FidelityLoss
from tuner.export import main as export
from tuner.search import main
from tuner.stages.target import target_front
from tuner.study.records import TrialRecord, schedule_key
from tuner.study.settings import SearchSettings

TARGET, SHORT = 160, 64


def _argv(folder: Path, out: Path, name: str, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", "hotpotqa,trec", "--n-examples", "2", "--max-prompt-tokens",
        str(TARGET), "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out),
        "--study-name", name, "--sampler", "random", "--tracking-uri", "none", "--speedup", "flops",
        "--max-kl", "10", "--n-trials", "4", "--min-speedup", "1", "--no-heldout", "--fresh-kl-examples", "0",
        *extra,
    ]  # fmt: skip


def _records(study_dir: Path) -> list[TrialRecord]:
    study = optuna.load_study(study_name=study_dir.name, storage=f"sqlite:///{study_dir / 'study.db'}")
    out = [TrialRecord.from_trial(t) for t in study.get_trials(deepcopy=False)]
    return [r for r in out if r is not None and r.complete]


def test_trials_run_short_and_the_decision_reads_the_target_kl(tiny_folder: Path, tmp_path: Path) -> None:
    assert main(_argv(tiny_folder, tmp_path, "full")) == 0
    assert main(_argv(tiny_folder, tmp_path, "mf", "--search-prompt-tokens", str(SHORT))) == 0
    full, short = _records(tmp_path / "full"), _records(tmp_path / "mf")
    # the trials ran on the short prompts, the full study's on the target's
    assert all(r.provenance["timing_prompt_tokens"] <= SHORT for r in short)
    assert any(r.provenance["timing_prompt_tokens"] > SHORT for r in full)
    # both FLOP models read the target length (the budget here, the mean prompt there): about the same speed
    at_full = {schedule_key(r.schedule): r for r in full}
    shared = [r for r in short if schedule_key(r.schedule) in at_full and r.values[1] > 0]
    assert shared
    for r in shared:
        assert r.values[0] == pytest.approx(at_full[schedule_key(r.schedule)].values[0], rel=0.01)
    # the decision read each front schedule's KL at the target: what the full-length search measured
    confirmation = json.loads((tmp_path / "mf" / "confirmation.json").read_text())
    judged = {c["trial"]: c["search_loss"] for c in confirmation["candidates"]}
    by_number = {r.number: r for r in short}
    checked = 0
    for number, kl in judged.items():
        r = by_number[number]
        if r.values[1] == 0:
            continue
        assert kl == pytest.approx(at_full[schedule_key(r.schedule)].values[1], rel=1e-3, abs=1e-12)
        assert kl != pytest.approx(r.values[1], rel=1e-3)  # not the short prompts' KL
        checked += 1
    assert checked
    # the recommendation's metrics are the ones judged, at the target (what the user runs)
    meta = json.loads((tmp_path / "mf" / "recommended.json").read_text())["metadata"]
    assert meta["metrics"]["kl"] == pytest.approx(judged[meta["trial"]], rel=1e-9, abs=1e-15)
    notes = meta.get("notes", [])
    assert any(f"trials on {SHORT}-token prompts" in n for n in notes)
    # tuner.export reads the stored study as the search left it: the same KL, judged at the target
    storage = f"sqlite:///{tmp_path / 'mf' / 'study.db'}"
    out = tmp_path / "exported"
    assert export(["--study-name", "mf", "--storage", storage, "--out", str(out)]) == 0
    again = json.loads((out / "recommended.json").read_text())["metadata"]
    assert again["trial"] == meta["trial"]
    assert again["metrics"]["kl"] == pytest.approx(meta["metrics"]["kl"], rel=1e-9, abs=1e-15)
    assert any(f"trials on {SHORT}-token prompts" in n for n in again.get("notes", []))


def test_the_target_measures_the_trials_faster_than_the_feasible_front_too() -> None:
    # (speedup, loss, bound) per trial: 5 and 3 are faster than the feasible front and over a cap of 1;
    # 2 is over it too, but slower than the feasible front's fastest (1), so the target never needs it
    points = [(1.0, 0.0, 0.01), (1.5, 1.0, 1.01), (1.4, 0.5, 3.0), (2.0, 3.0, 3.01), (1.2, -0.5, -0.49),
              (2.5, 4.0, 4.01)]  # fmt: skip
    records = [
        hand_record(i, s, kl, (0.0, 10.0 * i, 5.0, 0.0), upper=up) for i, (s, kl, up) in enumerate(points)
    ]
    assert [r.number for r in target_front(records, FidelityLoss(1.01))] == [5, 3, 1, 4]
    # a looser cap: 2 and 3 fit at the short length, 5 is still faster and over it
    assert [r.number for r in target_front(records, FidelityLoss(3.02))] == [5, 3, 1, 2, 4]
    # cap 0: only trial 4 (its bound below 0) fits; every faster front member is measured
    assert [r.number for r in target_front(records, FidelityLoss(0.0))] == [5, 3, 1, 2, 4]


def test_a_trial_over_the_short_cap_is_measured_at_the_target(tiny_folder: Path, tmp_path: Path) -> None:
    mf = ("--search-prompt-tokens", str(SHORT))
    # the same trials twice (same seed): first under a cap every one fits, to read their KLs
    assert main(_argv(tiny_folder, tmp_path, "probe", *mf)) == 0
    fastest = max(
        (r for r in _records(tmp_path / "probe") if r.values[1] > 0 and r.loss is not None),
        key=lambda r: r.values[0],
    )
    assert fastest.loss is not None and fastest.loss.value < fastest.loss.upper
    # then under a cap between the fastest trial's KL and its bound: it completes, infeasible at 64 tokens
    cap = (fastest.loss.value + fastest.loss.upper) / 2
    assert main([*_argv(tiny_folder, tmp_path, "mf", *mf), "--max-kl", repr(cap)]) == 0
    again = {r.number: r for r in _records(tmp_path / "mf")}[fastest.number]
    assert again.values == fastest.values  # the same trial, complete, over the cap
    meta = json.loads((tmp_path / "mf" / "recommended.json").read_text())["metadata"]
    note = next(n for n in meta["notes"] if n.startswith("multi-fidelity search"))
    assert "starred, over the search cap at 64 tokens" in note, note
    assert re.search(rf"#{fastest.number} [0-9.]+\* -> ", note), note  # measured again at the target


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"search_prompt_tokens": 2048}, "must be in 16..max_prompt_tokens (1024)"),
        ({"search_prompt_tokens": 8}, "must be in 16..max_prompt_tokens"),
        (
            {"search_prompt_tokens": 512, "speedup": "measured"},
            "needs --accuracy fidelity and --speedup flops",
        ),
        ({"search_prompt_tokens": 512, "accuracy": "score"}, "needs --accuracy fidelity and --speedup flops"),
    ],
)
def test_a_bad_search_length_is_one_line(extra: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SearchSettings(**extra)  # type: ignore[arg-type]


def test_the_search_length_is_part_of_the_study_and_its_cap_reads_the_prior_there() -> None:
    same = SearchSettings(max_prompt_tokens=4096)
    mf = SearchSettings(max_prompt_tokens=4096, search_prompt_tokens=1024)
    assert not same.multi_fidelity and same.search_eval().max_prompt_tokens == 4096
    assert mf.multi_fidelity and mf.search_eval().max_prompt_tokens == 1024
    assert mf.eval_only().max_prompt_tokens == 4096  # the decision's examples stay at the target
    assert same.study_identity() != mf.study_identity()
    # the cap is in the trials' units: the SmolLM2 prior recorded nearest 1024 tokens, not 4096's
    assert mf.search_prior is not None and mf.search_prior.max_prompt_tokens == 1024
    assert same.prior is not None and same.prior.max_prompt_tokens == 2048
    assert mf.cap is not None and mf.cap.prior == mf.search_prior.id
