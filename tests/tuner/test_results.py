"""tuner.study's front and pick rules, and tuner.results' export layout, on a study built by hand."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.distributions import IntDistribution
from optuna.trial import TrialState, create_trial

from lazyllm.schedule import Schedule
from tuner.results import export_study
from tuner.study import pareto_trials, recommended_trial

# (speedup, loss) per trial; 4 layers, percentiles recorded as the search records them
POINTS = [(1.0, 0.0), (1.5, 1.0), (1.4, 2.0), (2.0, 3.0), (1.2, -0.5), (1.5, 1.0)]


def _study() -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize"], study_name="hand")
    study.set_user_attr(
        "identity", {"model": "tiny-llama", "task": "qa", "search_space": "stages", "speedup": "flops"}
    )
    for i, (speed, loss) in enumerate(POINTS):
        study.add_trial(
            create_trial(
                values=[speed, loss],
                params={"i": i},
                distributions={"i": IntDistribution(0, 10)},
                user_attrs={"percentiles": [0.0, 10.0 * (i % 3), 5.0, 0.0], "flop_speedup": speed},
            )
        )
    study.add_trial(create_trial(state=TrialState.PRUNED, params={}, distributions={}))
    return study


def test_front_is_the_non_dominated_trials_fastest_first() -> None:
    front = pareto_trials(_study())
    # 2: dominated by 1 (slower and worse); 5 ties with 1 (same values) and both stay
    assert [t.number for t in front] == [3, 1, 5, 4]
    for t in front:
        assert not any(
            o.values[0] >= t.values[0] and o.values[1] <= t.values[1] and o.values != t.values for o in front
        )


def test_recommended_is_the_fastest_within_budget() -> None:
    study = _study()
    assert recommended_trial(study, 1.0).number == 1  # type: ignore[union-attr]
    assert recommended_trial(study, 3.0).number == 3  # type: ignore[union-attr]
    assert recommended_trial(study, 0.0).number == 4  # type: ignore[union-attr]
    assert recommended_trial(study, -1.0) is None


def test_export_layout_and_rewrite(tmp_path: Path) -> None:
    study = _study()
    out = export_study(study, tmp_path, max_accuracy_loss=1.0)
    assert [r["trial"] for r in out["front"]] == [3, 1, 5, 4] and out["recommended_trial"] == 1
    files = sorted(p.name for p in (tmp_path / "pareto").iterdir())
    assert files == ["trial-1.json", "trial-3.json", "trial-4.json", "trial-5.json"]
    rec = Schedule.load(tmp_path / "recommended.json")
    assert rec.percentiles == (0.0, 10.0, 5.0, 0.0) and rec.metadata["trial"] == 1
    assert [r["trial"] for r in json.loads((tmp_path / "pareto.json").read_text())] == [3, 1, 5, 4]
    for name in ("pareto.png", "pareto.html", "keep_curves.png", "keep_curves.html", "pareto.csv"):
        assert (tmp_path / name).stat().st_size > 0
    # a stricter budget: the stale recommendation and Pareto files are replaced, not left behind
    (tmp_path / "pareto" / "trial-99.json").write_text("{}")
    assert export_study(study, tmp_path, max_accuracy_loss=-1.0)["recommended"] is None
    assert not (tmp_path / "recommended.json").exists()
    assert not (tmp_path / "pareto" / "trial-99.json").exists()
