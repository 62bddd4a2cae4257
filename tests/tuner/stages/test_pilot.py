"""tuner.stages.pilot: a model with no packaged prior gets its search cap from a pilot on its own examples.

The cap's arithmetic is checked against the prior's formula; the wiring with a real study on a tiny
random model (no prior: the pilot runs, and where it measures no cost of KL the constant stays and
the report says so); a measured cap reaches the budget and the study's identity; a resumed study
reads the pilot it stored instead of measuring again.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tests.support import longbench_dir
from tuner.evaluation.losses import Budget
from tuner.search import main
from tuner.stages.pilot import PILOT, PILOT_ATTR, pilot_schedules, stored_pilot, wants_pilot
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


def _study_argv(model: Path, out: Path, tasks: str, *, n_trials: int) -> list[str]:
    """A tiny study on a model with no prior (so its cap comes from the pilot): study ``s`` in ``out``."""
    return [
        "--model", str(model), "--task", tasks, "--n-examples", "2", "--max-prompt-tokens", "96",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--study-name", "s",
        "--sampler", "random", "--tracking-uri", "none", "--n-trials", str(n_trials), "--no-heldout",
    ]  # fmt: skip


def test_a_study_on_a_model_without_a_prior_runs_the_pilot_and_says_what_set_the_cap(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _study_argv(tiny_folder, tmp_path, "hotpotqa,trec", n_trials=2)
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
    assert study.user_attrs[PILOT_ATTR]["n"] == 4


def test_a_resumed_study_reads_its_pilot_instead_of_measuring_it_again(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _study_argv(tiny_folder, tmp_path, "hotpotqa", n_trials=1)
    assert main(argv) == 0
    capsys.readouterr()
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    # what another machine's pilot might have measured: a slope no forward of this one gives, and the cap
    # it sets in the identity; a worker that measured again would find its own cap and be refused
    cap = pilot_cap(2.0, 7.5, SearchSettings().calibration_exponent)
    assert cap is not None
    study.set_user_attr(PILOT_ATTR, {"slope": 7.5, "points": [["paper-style", 0.01, 0.5]], "n": 99})
    study.set_user_attr(
        "identity", study.user_attrs["identity"] | {"search_cap": cap.nats, "search_cap_source": "pilot"}
    )
    assert main([*argv, "--n-trials", "2"]) == 0
    out = capsys.readouterr().out
    assert "pilot on 99 validation examples (paper-style: KL 0.0100 nats" in out
    assert "read from the study: measured when it was created" in out
    identity = optuna.load_study(
        study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}"
    ).user_attrs["identity"]
    assert (identity["search_cap"], identity["search_cap_source"]) == (cap.nats, "pilot")


def test_a_stored_pilot_is_read_only_where_it_is_whole(tmp_path: Path) -> None:
    settings = SearchSettings(model=str(tmp_path), study_name="s")
    storage = optuna.storages.InMemoryStorage()
    assert stored_pilot(settings, storage) is None  # no study yet: the pilot runs
    study = optuna.create_study(study_name=settings.name, storage=storage)
    assert stored_pilot(settings, storage) is None  # a study stored before pilots were kept
    for broken in (
        [1],
        {"slope": "7.5", "points": [], "n": 3},
        {"slope": float("nan"), "points": [], "n": 3},
        {"slope": 7.5, "points": [["a", 0.1]], "n": 3},
        {"slope": 7.5, "points": [["a", 0.1, True]], "n": 3},
        {"slope": 7.5, "points": [], "n": True},
    ):
        study.set_user_attr(PILOT_ATTR, broken)
        assert stored_pilot(settings, storage) is None, broken
    study.set_user_attr(PILOT_ATTR, {"slope": 7.5, "points": [["a", 0.1, 1]], "n": 3})
    pilot = stored_pilot(settings, storage)
    assert pilot is not None and pilot.stored and pilot.points == (("a", 0.1, 1.0),) and pilot.n == 3
    assert pilot.cap == pilot_cap(settings.max_accuracy_loss, 7.5, settings.calibration_exponent)
    study.set_user_attr(PILOT_ATTR, {"slope": None, "points": [], "n": 3})  # measured no cost of KL
    pilot = stored_pilot(settings, storage)
    assert pilot is not None and pilot.cap is None and "the constant cap stays" in pilot.text()
