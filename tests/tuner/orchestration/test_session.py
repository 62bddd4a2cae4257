"""tuner.orchestration.session: the stages run in order and every output is written once, after they all ran.

A run stopped during confirmation leaves no unconfirmed ``recommended.json`` (the files are written
from the finished outcome only), and an output a run regenerates, truncated by an earlier crash, never
blocks a rerun.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner.orchestration import session as session_module
from tuner.search import main


def _argv(folder: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(folder), "--task", "hotpotqa,trec", "--n-examples", "1", "--max-prompt-tokens", "96",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "s",
        "--sampler", "random", "--tracking-uri", "none", "--speedup", "flops", "--max-kl", "10", *extra,
    ]  # fmt: skip


def test_ctrl_c_during_confirmation_leaves_no_unconfirmed_recommendation(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_confirm = session_module.confirm
    calls: list[int] = []

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise KeyboardInterrupt  # Ctrl-C while the candidates are being re-scored

    monkeypatch.setattr(session_module, "confirm", interrupted)
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "2", "--no-heldout")) == 130
    study_dir = tmp_path / "s"
    assert calls and not (study_dir / "recommended.json").exists()
    assert not (study_dir / "pareto.json").exists()  # nothing is written before the outcome is whole
    # the rerun confirms, then writes: the recommendation carries its confirmation
    monkeypatch.setattr(session_module, "confirm", real_confirm)
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "2", "--no-heldout")) == 0
    rec = Schedule.load(study_dir / "recommended.json")
    assert rec.metadata["status"] == "confirmed" and rec.metadata["confirmation"]["status"] == "confirmed"
    # stopped during the next run's confirmation: the confirmed file of the last whole run stays
    monkeypatch.setattr(session_module, "confirm", interrupted)
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "3", "--no-heldout")) == 130
    assert Schedule.load(study_dir / "recommended.json").metadata["status"] == "confirmed"


def test_a_truncated_output_never_blocks_a_rerun(tiny_folder: Path, tmp_path: Path) -> None:
    """Defect: a truncated heldout.json failed every rerun with "Unterminated string" naming no file."""
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "2", "--confirm-k", "0")) == 0
    study_dir = tmp_path / "s"
    for name in ("heldout.json", "pareto.json", "confirmation.json", "recommended.json"):
        (study_dir / name).write_text('{"rows": [{"schedule": "recomm')
    assert main(_argv(tiny_folder, tmp_path, "--n-trials", "3", "--confirm-k", "0")) == 0
    heldout = json.loads((study_dir / "heldout.json").read_text())
    assert [r["schedule"].split(" (")[0] for r in heldout["rows"]] == [
        "recommended",
        "best paper-style",
        "best one-stage",
    ]
    assert json.loads((study_dir / "pareto.json").read_text())
    assert Schedule.load(study_dir / "recommended.json").metadata["status"] == "provisional"


def test_a_non_default_scoring_rule_travels_from_the_trial_to_the_file(
    tiny_folder: Path, tmp_path: Path
) -> None:
    """Issue 20: a study that searches the FastKV rule exports it, and the exported file reproduces the
    trial's validation KL when loaded into LazyLLM (the whole schedule travels in the trial record)."""
    space = tmp_path / "fastkv.yaml"
    space.write_text(
        "kind: stages\nmax_stages: 2\npct_low: 30\npct_high: 60\npct_step: 10\nscoring: [fastkv, w1-raw-avg5-sum]\n"
    )
    argv = _argv(
        tiny_folder,
        tmp_path,
        "--n-trials",
        "4",
        "--confirm-k",
        "0",
        "--no-heldout",
        "--search-space",
        str(space),
    )
    assert main(argv) == 0
    study_dir = tmp_path / "s"
    rec = Schedule.load(study_dir / "recommended.json")
    assert rec.prunes and str(rec.scoring) in ("w8-softmax-max7-sum", "w1-raw-avg5-sum")
    from lazyllm.engine import LazyLLM
    from tuner.orchestration.session import open_session
    from tuner.search import parse_settings
    from tuner.stages.front import study_records

    session = open_session(parse_settings(argv), progress=False)
    try:
        record = next(r for r in study_records(session.study) if r.number == rec.metadata["trial"])
        assert record.schedule.scoring == rec.scoring and record.loss is not None
        again = session.runner.search_loss.measure(
            session.runner.context, LazyLLM(session.model, rec, strict_model_name=False), "again"
        )
        assert again.estimate is not None and again.estimate.value == pytest.approx(
            record.loss.value, rel=1e-6, abs=1e-9
        )
        # the default rule on the same percentiles drifts differently: the rule is what was measured
        plain = LazyLLM(session.model, rec.with_scoring("last"), strict_model_name=False)
        other = session.runner.search_loss.measure(session.runner.context, plain, "plain")
        assert other.estimate is not None
        assert other.estimate.value != pytest.approx(record.loss.value, rel=1e-9, abs=1e-12)
    finally:
        session.close()
