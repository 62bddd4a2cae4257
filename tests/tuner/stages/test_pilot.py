"""tuner.stages.pilot: a model with no packaged prior gets its search cap from a pilot on its own examples.

The cap's arithmetic is checked against the prior's formula; the wiring with a real study on a tiny
random model (no prior: the pilot runs, and where it measures no cost of KL the constant stays and
the report says so); a measured cap reaches the budget and the study's identity.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tests.support import longbench_dir
from tuner.evaluation.losses import Budget
from tuner.search import main
from tuner.stages.pilot import PILOT, pilot_schedules, wants_pilot
from tuner.statistics.cap import CAP_MARGIN, KL_PER_POINT, SearchCap, pilot_cap
from tuner.study.settings import SearchSettings


def test_the_pilot_cap_is_where_its_slope_predicts_the_margin_times_the_budget() -> None:
    cap = pilot_cap(2.0, 10.0, 0.5)
    assert cap is not None and cap.source == "pilot"
    assert cap.nats == pytest.approx((CAP_MARGIN * 2.0 / 10.0) ** 2)
    assert pilot_cap(2.0, 14.4, 1.0).nats == pytest.approx(CAP_MARGIN * 2.0 / 14.4)  # type: ignore[union-attr]
    assert pilot_cap(2.0, 0.0, 0.5) is None and pilot_cap(2.0, -3.0, 1.0) is None  # no cost: the constant
    assert "pilot" in cap.text()


def test_only_a_study_that_would_search_under_the_constant_runs_a_pilot(tmp_path: Path) -> None:
    assert not wants_pilot(SearchSettings())  # SmolLM2: its packaged prior sets the cap
    assert not wants_pilot(SearchSettings(model=str(tmp_path), max_kl=0.3))
    assert not wants_pilot(SearchSettings(model=str(tmp_path), accuracy="score"))
    assert wants_pilot(SearchSettings(model=str(tmp_path)))  # no prior for this model: the constant
    assert set(pilot_schedules("m", 30)) == set(PILOT)
    assert all(any(s.percentiles) for s in pilot_schedules("m", 4).values())  # each prunes something


def test_a_measured_cap_is_the_budget_and_the_identity(tmp_path: Path) -> None:
    settings = SearchSettings(model=str(tmp_path)).with_cap(SearchCap(0.0123, "pilot"))
    assert Budget.from_settings(settings).search.budget == pytest.approx(0.0123)
    identity = settings.study_identity()
    assert (identity["search_cap"], identity["search_cap_source"]) == (0.0123, "pilot")


def test_a_study_on_a_model_without_a_prior_runs_the_pilot_and_says_what_set_the_cap(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--model", str(tiny_folder), "--task", "hotpotqa,trec", "--n-examples", "2", "--max-prompt-tokens", "96",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(tmp_path), "--study-name", "s",
        "--sampler", "random", "--tracking-uri", "none", "--n-trials", "2", "--no-heldout",
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "pilot on 4 validation examples" in out
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    source = study.user_attrs["identity"]["search_cap_source"]
    notes = json.loads((tmp_path / "s" / "recommended.json").read_text())["metadata"]["notes"]
    pilot = [n for n in notes if n.startswith("pilot on 4 validation examples")]
    assert len(pilot) == 1 and all(name in pilot[0] for name in PILOT)
    # a random model's answers do not change under pruning: no cost of KL, so the constant is the last resort
    if "no cost of KL measured" in pilot[0]:
        assert source == "constant" and study.user_attrs["identity"]["search_cap"] == pytest.approx(
            2 * KL_PER_POINT
        )
    else:
        assert source == "pilot"
    assert main(argv) == 0  # resumed: the pilot measures the same cap, so the identity matches
