"""tuner.statistics.cap: a fidelity search's cap follows the model's slope prior where one is packaged
(its value derived here from the prior file's own numbers), the constant only where none is, and the
constraint a trial hands Optuna is its KL bound minus that cap."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.support import longbench_dir
from tuner.evaluation.losses import Budget
from tuner.search import main
from tuner.stages.front import study_records
from tuner.statistics.cap import CAP_MARGIN, KL_PER_POINT, SearchCap, search_cap
from tuner.statistics.prior import PRIOR_DIR
from tuner.study.identity import StudyIdentity
from tuner.study.settings import SearchSettings


def _from_file(name: str, budget: float) -> float:
    """The cap the prior file ``name`` asks for, from its raw JSON: the KL at which its slope predicts
    ``CAP_MARGIN`` times the budget, ``(margin * B / slope)^(1/p)``."""
    data = json.loads((PRIOR_DIR / name).read_text())
    return float((CAP_MARGIN * budget / data["slope_points_per_nat"]) ** (1 / data.get("exponent", 1.0)))


@pytest.mark.parametrize(("preset", "target"), [("openqa-4k", 4096), ("openqa-8k", 8160), ("qa-4k", 4096)])
def test_the_exploration_cap_binds_short_trials_only(preset: str, target: int) -> None:
    """The long-prompt presets' ``search_max_kl`` (0.5 nats) is a cap for trials on short prompts,
    whose front is judged again at the target. A full-length search of the same preset (issue 63:
    openqa-4k seed 1 at 4096 roamed to 12.46x under it) takes the prior's cap at its own length, and
    ``--max-kl`` wins over both."""
    from tuner.study.settings import resolve_settings

    short = resolve_settings(preset, {})
    assert short.multi_fidelity and short.cap == SearchCap(0.5, "exploration")
    assert (
        "exploration cap" in short.cap.text() and short.study_identity()["search_cap_source"] == "exploration"
    )
    full = resolve_settings(preset, {"search_prompt_tokens": target})
    assert not full.multi_fidelity and full.search_max_kl == 0.5
    assert full.cap is not None and full.cap.source == "prior" and full.cap.nats < 0.5
    assert full.cap == SearchSettings(max_prompt_tokens=target, calibration_exponent=0.5).cap
    assert resolve_settings(preset, {"max_kl": 0.3}).cap == SearchCap(0.3, "max_kl")


@pytest.mark.parametrize(
    ("tokens", "exponent", "name"),
    [(1024, 1.0, "smollm2-135m-1024.json"), (2048, 1.0, "smollm2-135m-2048.json"),
     (1024, 0.5, "smollm2-135m-1024-p0.5.json"), (2048, 0.5, "smollm2-135m-2048-p0.5.json")],
)  # fmt: skip
def test_the_cap_follows_the_packaged_prior_of_the_model_and_length(
    tokens: int, exponent: float, name: str
) -> None:
    settings = SearchSettings(max_prompt_tokens=tokens, calibration_exponent=exponent, max_accuracy_loss=2.0)
    cap = settings.cap
    assert cap is not None and cap.source == "prior" and cap.prior is not None
    assert cap.nats == pytest.approx(_from_file(name, 2.0), rel=1e-12)
    assert cap.nats < KL_PER_POINT * 2.0  # the evidence is tighter than the constant it replaces
    budget = Budget.from_settings(settings)
    assert budget.search.budget == cap.nats and budget.cap == cap
    # the study's identity carries it, and a stored study's budget reads it back unchanged
    assert Budget.from_settings(StudyIdentity.from_dict(settings.study_identity())) == budget


def test_without_evidence_the_constant_and_with_max_kl_the_users_cap() -> None:
    none = SearchSettings(slope_prior="none", max_accuracy_loss=2.0)
    assert none.cap == SearchCap(KL_PER_POINT * 2.0, "constant")
    other = SearchSettings(model="gemma3-270m", max_accuracy_loss=1.0)  # no prior packaged for it
    assert other.cap == SearchCap(KL_PER_POINT * 1.0, "constant")
    assert SearchSettings(max_kl=0.05).cap == SearchCap(0.05, "max_kl")
    assert (
        SearchSettings(accuracy="score").cap is None
        and Budget.from_settings(SearchSettings(accuracy="score")).cap is None
    )
    # a study stored before the cap was recorded searched with the constant (or its --max-kl)
    old = {k: v for k, v in SearchSettings().study_identity().items() if not k.startswith("search_cap")}
    assert Budget.from_settings(StudyIdentity.from_dict(old)).search.budget == KL_PER_POINT * 2.0
    # ... and resumes with the settings that give that cap (what tuner.study.storage.open_study compares)
    assert StudyIdentity.from_dict(old).to_dict() == SearchSettings(slope_prior="none").study_identity()
    assert StudyIdentity.from_dict(old).to_dict() != SearchSettings().study_identity()
    with pytest.raises(ValueError, match="names its prior"):
        SearchCap(0.1, "prior")
    assert search_cap(2.0, None, None).text().startswith("0.6000 nats (no calibration known")


def test_an_agreement_budget_caps_at_the_gold_points_it_corresponds_to(tmp_path: Path) -> None:
    """A prompts file without answers: 20 agreement points are 2 gold points, capped at the constant
    per gold point with its own source (no agreement calibration is packaged); --max-kl still wins."""
    from tuner.data.prompts import AGREEMENT_BUDGET, GOLD_PER_AGREEMENT_POINT
    from tuner.study.settings import resolve_settings

    task = tmp_path / "mine.jsonl"
    task.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"q {i}?"}) + "\n" for i in range(30)))
    mine = resolve_settings(None, {"task": str(task)}, SearchSettings)
    assert (
        mine.budget_kind == "agreement" and mine.max_accuracy_loss == AGREEMENT_BUDGET and mine.max_kl is None
    )
    gold = AGREEMENT_BUDGET * GOLD_PER_AGREEMENT_POINT
    assert mine.cap == SearchCap(KL_PER_POINT * gold, "agreement")
    assert mine.cap.text().startswith(f"{KL_PER_POINT * gold:.4f} nats (an agreement budget")
    assert Budget.from_settings(StudyIdentity.from_dict(mine.study_identity())).cap == mine.cap
    assert resolve_settings(None, {"task": str(task), "max_kl": 0.1}, SearchSettings).cap == SearchCap(
        0.1, "max_kl"
    )
    tighter = resolve_settings(None, {"task": str(task), "max_accuracy_loss": 10.0}, SearchSettings)
    assert tighter.cap is not None and tighter.cap.nats == pytest.approx(
        KL_PER_POINT * 10.0 * GOLD_PER_AGREEMENT_POINT
    )


def test_the_constraint_optuna_reads_is_the_trials_bound_minus_the_prior_cap(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real (tiny) study with a slope prior for its model: every complete trial's Optuna constraint
    is its KL bound minus the prior-derived cap, the identity and the report say which source set it."""
    packaged = json.loads((PRIOR_DIR / "smollm2-135m-1024-p0.5.json").read_text())  # the default shape
    prior = tmp_path / "tiny-prior.json"
    prior.write_text(json.dumps({**packaged, "model": tiny_folder.name.lower()}))
    argv = [
        "--model", str(tiny_folder), "--task", "hotpotqa,trec", "--n-examples", "1", "--max-prompt-tokens", "96",
        "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(tmp_path), "--study-name", "s",
        "--sampler", "random", "--tracking-uri", "none", "--speedup", "flops", "--n-trials", "3",
        "--confirm-k", "0", "--no-heldout", "--slope-prior", str(prior),
    ]  # fmt: skip
    assert main(argv) == 0
    cap = _from_file("smollm2-135m-1024-p0.5.json", 2.0)
    study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 's' / 'study.db'}")
    identity = StudyIdentity.of_study(study)
    assert (
        identity is not None
        and identity.search_cap == pytest.approx(cap)
        and identity.search_cap_source == "prior"
    )
    records = {r.number: r for r in study_records(study)}
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert complete  # keep-all at least: KL 0, so its constraint is exactly -cap
    for t in complete:
        loss = records[t.number].loss
        assert loss is not None
        assert t.constraints == {"accuracy_loss": pytest.approx(loss.upper - cap, abs=1e-12)}
    assert f"Search cap: {cap:.4f} nats (the slope prior" in capsys.readouterr().out


def test_mlflow_parameters_say_which_source_set_the_cap(tmp_path: Path) -> None:
    from tuner.tracking.runs import Tracker, end_open_runs

    settings = SearchSettings(model="smollm2-135m", output=str(tmp_path), study_name="toy")
    study = optuna.create_study(study_name="toy", directions=["maximize", "minimize"])
    study.set_user_attr("identity", settings.study_identity())
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", settings, study, Budget.from_settings(settings))
    try:
        params = tracker.client.get_run(tracker.parent_id).data.params
        assert settings.cap is not None
        assert params["search_cap_source"] == "prior" and params["search_cap_prior"] == settings.cap.prior
        assert float(params["search_cap"]) == pytest.approx(_from_file("smollm2-135m-1024-p0.5.json", 2.0))
    finally:
        end_open_runs("FINISHED", "test over")
