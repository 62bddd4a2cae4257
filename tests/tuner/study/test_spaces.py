from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.samplers import RandomSampler
from optuna.trial import FixedTrial

from lazyllm.schedule import Schedule
from lazyllm.scoring import Scoring
from tuner.study.handmade import one_stage_grid
from tuner.study.records import schedule_key
from tuner.study.spaces import (
    SEARCH_SPACE_DIR,
    ParametricSpace,
    PerLayerSpace,
    SearchSpace,
    StagesSpace,
    compose_percentiles,
    depth_to_layer,
    list_spaces,
    load_space,
    shape_shares,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

NAMES = ["parametric", "per_layer", "stages"]
SPACES: dict[str, SearchSpace] = {name: load_space(name) for name in NAMES}


def _check_valid(schedule: Schedule, num_layers: int) -> None:
    assert schedule.num_layers == num_layers
    assert schedule.percentiles[-1] == 0.0
    assert all(0.0 <= p < 100.0 for p in schedule.percentiles)


def _ask(space: SearchSpace, num_layers: int, study: optuna.Study) -> tuple[Schedule, dict[str, Any]]:
    """One trial: the suggested schedule and the trial's params; an out-of-range enqueued value fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trial = study.ask()
        schedule = space.suggest(trial, "m", num_layers)
    return schedule, trial.params


# --------------------------------------------------------------------------------------------------
# registry and loading
def test_registry_lists_the_packaged_spaces() -> None:
    assert list_spaces() == NAMES
    assert Path(__file__).resolve().parents[3] / "search_spaces" == SEARCH_SPACE_DIR
    assert isinstance(SPACES["stages"], StagesSpace)
    assert isinstance(SPACES["parametric"], ParametricSpace)
    assert isinstance(SPACES["per_layer"], PerLayerSpace)
    stages = SPACES["stages"]
    assert isinstance(stages, StagesSpace)
    assert (stages.max_stages, stages.min_depth, stages.pct_low, stages.pct_high, stages.pct_step) == (
        4,
        0.0,
        10.0,
        90.0,
        5.0,
    )
    per_layer = SPACES["per_layer"]
    assert isinstance(per_layer, PerLayerSpace)
    assert (per_layer.pct_high, per_layer.pct_step) == (60.0, 5.0)


def test_unknown_name_lists_the_names() -> None:
    with pytest.raises(ValueError) as info:
        load_space("x")
    assert str(info.value) == "Unknown search space 'x'. Available: parametric, per_layer, stages"


def test_describe_is_json_and_names_the_space() -> None:
    for name, space in SPACES.items():
        desc = space.describe()
        assert json.loads(json.dumps(desc)) == desc
        assert desc["name"] == name
        assert desc["kind"] == name
    assert SPACES["parametric"].describe()["shapes"] == ["even", "front", "back"]


def test_custom_yaml_path(tmp_path: Path) -> None:
    path = tmp_path / "narrow.yaml"
    path.write_text("kind: stages\nmax_stages: 2\nmin_depth: 0.5\npct_low: 20\npct_high: 40\n")
    space = load_space(str(path))
    assert isinstance(space, StagesSpace)
    assert space.name == "narrow"
    assert (space.max_stages, space.min_depth, space.pct_low, space.pct_high, space.pct_step) == (
        2,
        0.5,
        20.0,
        40.0,
        None,
    )
    assert load_space(path) == space
    assert space.layer_range(30) == (14, 28)
    assert space.layer_range(18) == (8, 16)  # round(0.5 * 17) = 8 (round half to even)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "field", "value"),
    [
        ("kind: stages\npct_high: 120\n", "pct_high", "120"),
        ("kind: stages\nmax_stages: -1\n", "max_stages", "-1"),
        ("kind: stages\npct_low: 50\npct_high: 40\n", "pct_low", "50"),
        ("kind: stages\npct_step: 7\n", "pct_step", "7"),
        ("kind: stages\nmax_stages: two\n", "max_stages", "'two'"),
        ("kind: stages\nmin_depth: 1.5\n", "min_depth", "1.5"),
        ("kind: per_layer\npct_high: 120\n", "pct_high", "120"),
        ("kind: per_layer\npct_high: 0\n", "pct_high", "0"),
        ("kind: pyramid\n", "kind", "'pyramid'"),
        ("description: no kind\n", "kind", None),
        ("kind: stages\nmax_stage: 3\n", "max_stage", None),
        (
            "kind: parametric\nstart_depth_low: 0.1\nstart_depth_high: 0.8\nfinal_keep_low: 0.1\n"
            "n_stages_low: 1\nn_stages_high: 4\n",
            "final_keep_high",
            None,
        ),
        (
            "kind: parametric\nstart_depth_low: 0.1\nstart_depth_high: 0.8\nfinal_keep_low: 0.0\n"
            "final_keep_high: 1.0\nn_stages_low: 1\nn_stages_high: 4\n",
            "final_keep_low",
            "0.0",
        ),
        (
            "kind: parametric\nstart_depth_low: 0.1\nstart_depth_high: 0.8\nfinal_keep_low: 0.1\n"
            "final_keep_high: 1.0\nn_stages_low: 1\nn_stages_high: 4\nshapes: [even, spiral]\n",
            "shapes",
            "'spiral'",
        ),
    ],
)
def test_invalid_yaml_names_file_field_and_value(
    tmp_path: Path, text: str, field: str, value: str | None
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ValueError) as info:
        load_space(str(path))
    message = str(info.value)
    assert str(path) in message
    assert field in message
    if value is not None:
        assert f"{field} = {value}" in message or value in message


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read search space file"):
        load_space(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="not valid YAML"):
        load_space(_write(tmp_path, "kind: [stages\n"))
    with pytest.raises(ValueError, match="must be a mapping"):
        load_space(_write(tmp_path, "- kind\n- stages\n"))


# --------------------------------------------------------------------------------------------------
# every suggested point is a valid schedule, and suggest agrees with to_schedule
@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(NAMES), num_layers=st.integers(2, 40), seed=st.integers(0, 2**31 - 1))
def test_random_points_are_valid_and_rebuild(name: str, num_layers: int, seed: int) -> None:
    space = SPACES[name]
    study = optuna.create_study(sampler=RandomSampler(seed=seed))
    for _ in range(3):
        schedule, params = _ask(space, num_layers, study)
        _check_valid(schedule, num_layers)
        rebuilt = space.to_schedule(params, "m", num_layers)
        assert rebuilt == schedule
        assert rebuilt.metadata == schedule.metadata
        assert schedule.metadata["search_space"] == name


@settings(max_examples=150, deadline=None)
@given(data=st.data(), num_layers=st.integers(2, 40))
def test_fixed_stage_points(data: st.DataObject, num_layers: int) -> None:
    space = SPACES["stages"]
    assert isinstance(space, StagesSpace)
    low, high = space.layer_range(num_layers)
    n = data.draw(st.integers(1, space.max_stages))  # 0 (keep-all) is the reference trial, not sampled
    params: dict[str, Any] = {"n_stages": n}
    for i in range(n):
        params[f"stage{i}_layer"] = data.draw(st.integers(low, high))
        params[f"stage{i}_pct"] = float(data.draw(st.integers(2, 18)) * 5)
    params["scoring"] = data.draw(st.sampled_from(space.scoring))
    trial = FixedTrial(params)
    schedule = space.suggest(trial, "m", num_layers)
    _check_valid(schedule, num_layers)
    assert trial.params == params
    assert space.to_schedule(trial.params, "m", num_layers) == schedule
    assert str(schedule.scoring) == params["scoring"]
    # the keep fraction at the end is the product of the stages' keeps (capped per layer)
    expected = math.prod(1 - params[f"stage{i}_pct"] / 100 for i in range(n))
    end_keep = schedule.keep_fractions()[-1]
    assert end_keep >= expected - 1e-12
    if all(p < 99 for p in schedule.percentiles):
        assert end_keep == pytest.approx(expected, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(
    num_layers=st.integers(2, 40),
    start_depth=st.floats(0.1, 0.8),
    final_keep=st.floats(0.1, 1.0),
    n_stages=st.integers(1, 4),
    shape=st.sampled_from(["even", "front", "back"]),
)
def test_parametric_reaches_final_keep(
    num_layers: int, start_depth: float, final_keep: float, n_stages: int, shape: str
) -> None:
    space = SPACES["parametric"]
    params = {
        "start_depth": start_depth,
        "final_keep": final_keep,
        "n_stages": n_stages,
        "shape": shape,
        "scoring": "w8-softmax-max7-sum",
    }
    schedule = space.suggest(FixedTrial(params), "m", num_layers)
    _check_valid(schedule, num_layers)
    assert space.to_schedule(params, "m", num_layers) == schedule
    assert schedule.keep_fractions()[-1] == pytest.approx(final_keep, abs=1e-6)
    # nothing prunes before the start layer; the start layer prunes unless final_keep is (about) 1
    start = depth_to_layer(start_depth, num_layers)
    assert all(p == 0 for p in schedule.percentiles[:start])
    if final_keep == 1.0:
        assert not schedule.prunes
    elif final_keep < 1.0 - 1e-9:
        assert schedule.percentiles[start] > 0


# --------------------------------------------------------------------------------------------------
# values by hand
def test_stages_same_layer_composes() -> None:
    space = SPACES["stages"]
    params = {
        "n_stages": 3,
        "stage0_layer": 5,
        "stage0_pct": 50.0,
        "stage1_layer": 2,
        "stage1_pct": 30.0,
        "stage2_layer": 5,
        "stage2_pct": 40.0,
    }
    schedule = space.to_schedule(params, "m", 10)
    # layer 5 keeps 0.5 * 0.6 = 0.3, so it prunes 70%
    assert schedule.percentiles[5] == pytest.approx(70.0, abs=1e-12)
    assert schedule.percentiles[2] == 30.0
    assert [layer for layer, p in enumerate(schedule.percentiles) if p > 0] == [2, 5]
    assert schedule.keep_fractions()[-1] == pytest.approx(0.7 * 0.3)
    # the cap: 90% twice would keep 1%, but a layer prunes at most 99%
    capped = {"n_stages": 2, "stage0_layer": 1, "stage0_pct": 90.0, "stage1_layer": 1, "stage1_pct": 90.0}
    assert space.to_schedule(capped, "m", 4).percentiles == (0.0, 99.0, 0.0, 0.0)
    hot = {**capped, "n_stages": 3, "stage2_layer": 1, "stage2_pct": 90.0}
    assert space.to_schedule(hot, "m", 4).percentiles == (0.0, 99.0, 0.0, 0.0)
    assert compose_percentiles([50.0, 40.0]) == pytest.approx(70.0)
    assert compose_percentiles([]) == 0.0


def test_stages_zero_is_keep_all() -> None:
    """``n_stages = 0`` reads back as keep-all (a study stored before); the sampler is never offered it
    (tests/tuner/study/test_reference.py)."""
    schedule = SPACES["stages"].to_schedule({"n_stages": 0, "scoring": "w1-softmax-none-mean"}, "m", 30)
    assert schedule == Schedule.keep_all("m", 30)
    assert not schedule.prunes


def test_stages_ignores_other_params_and_rejects_bad_ones() -> None:
    space = SPACES["stages"]
    params = {"n_stages": 1, "stage0_layer": 3, "stage0_pct": 20.0, "stage1_layer": 0, "lr": 0.1}
    assert space.to_schedule(params, "m", 6) == Schedule.from_layers("m", 6, {3: 20.0})
    with pytest.raises(ValueError, match=r"params\['stage0_pct'\] = 95.0"):
        space.to_schedule({**params, "stage0_pct": 95.0}, "m", 6)
    with pytest.raises(ValueError, match=r"params\['stage0_layer'\] = 5"):
        space.to_schedule({**params, "stage0_layer": 5}, "m", 6)  # the last layer cannot prune
    with pytest.raises(ValueError, match="no 'stage0_pct'"):
        space.to_schedule({"n_stages": 1, "stage0_layer": 3}, "m", 6)
    with pytest.raises(ValueError, match="num_layers = 1"):
        space.to_schedule({"n_stages": 0}, "m", 1)


def test_parametric_shapes_by_hand() -> None:
    assert shape_shares("even", 4, 2.0) == [0.25] * 4
    assert shape_shares("front", 3, 2.0) == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    assert shape_shares("back", 3, 2.0) == pytest.approx([1 / 7, 2 / 7, 4 / 7])
    space = SPACES["parametric"]
    # 9 layers, start 0.25 -> layer 2; 3 stages at 2 + round(i * 5 / 2) = 2, 4 (2.5 rounds to even), 7
    params = {"start_depth": 0.25, "final_keep": 0.125, "n_stages": 3, "shape": "even"}
    schedule = space.to_schedule(params, "m", 9)
    assert [layer for layer, p in enumerate(schedule.percentiles) if p > 0] == [2, 4, 7]
    for layer in (2, 4, 7):
        assert schedule.percentiles[layer] == pytest.approx(50.0)
    back = space.to_schedule({**params, "shape": "back"}, "m", 9)
    # back: shares 1/7, 2/7, 4/7 of log(0.125) = 3 log(0.5)
    assert back.percentiles[2] == pytest.approx(100 * (1 - 0.5 ** (3 / 7)))
    assert back.percentiles[7] == pytest.approx(100 * (1 - 0.5 ** (12 / 7)))
    # final_keep 1 prunes nothing
    assert not space.to_schedule({**params, "final_keep": 1.0}, "m", 9).prunes


@pytest.mark.parametrize("num_layers", [4, 5, 9, 18, 30, 40])
@pytest.mark.parametrize("n_stages", [2, 3, 4])
def test_parametric_front_prunes_more_early_than_back(num_layers: int, n_stages: int) -> None:
    space = SPACES["parametric"]
    params = {"start_depth": 0.1, "final_keep": 0.2, "n_stages": n_stages}
    mid = num_layers // 2
    keep = {
        shape: space.to_schedule({**params, "shape": shape}, "m", num_layers).keep_fractions()
        for shape in ("front", "even", "back")
    }
    assert keep["front"][mid] < keep["even"][mid] < keep["back"][mid]
    for shape in keep:
        assert keep[shape][-1] == pytest.approx(0.2, abs=1e-6)


# --------------------------------------------------------------------------------------------------
# warm starts
@pytest.mark.parametrize("num_layers", [2, 3, 8, 18, 30])
@pytest.mark.parametrize("name", NAMES)
def test_warm_start_points_lie_in_the_space(name: str, num_layers: int) -> None:
    space = SPACES[name]
    points = space.warm_start(num_layers)
    # paper-style (keep-all is the study's reference trial, not a warm start), the families (one stage
    # at mid depth; in the stages space, the paper-style recipe from a quarter of depth, chosen on
    # validation), then the two published peers at their published settings (per_layer caps a layer at
    # 60%, so a peer's published 80% becomes 60%)
    families = 2 if isinstance(space, StagesSpace) and num_layers > 2 else 1  # 2 layers: quarter = paper
    clipped = name == "per_layer"
    hand_made = space.hand_made_starts(num_layers, points[: 1 + families + 2])
    assert len(points) == 1 + families + 2 + len(hand_made)
    assert points[len(points) - len(hand_made) :] == hand_made
    study = optuna.create_study(sampler=RandomSampler(seed=0))
    for point in points:
        study.enqueue_trial(point)
    schedules = []
    for point in points:
        schedule, params = _ask(space, num_layers, study)  # warns (so fails) if a value is out of range
        assert params == point
        assert space.to_schedule(point, "m", num_layers) == schedule
        _check_valid(schedule, num_layers)
        schedules.append(schedule)
    assert all(s.prunes for s in schedules)
    paper, mid, *quarter, gemfilter, tsp = schedules[: len(schedules) - len(hand_made)]
    assert paper.prunes and paper.scoring == Scoring()
    assert paper.keep_fractions()[-1] < 0.5
    # one stage at mid depth (clipped to the space's layers) keeping half
    assert mid.scoring == Scoring() and sum(p > 0 for p in mid.percentiles) == 1
    assert mid.keep_fractions()[-1] == pytest.approx(0.5, abs=0.03)
    for q in quarter:  # paper-style from a quarter of depth, 30% reaching the end (on the 5% grid)
        assert q.scoring == Scoring() and q.keep_fractions()[-1] == pytest.approx(0.3, abs=0.03)
        first = next(i for i, p in enumerate(q.percentiles) if p > 0)
        assert first == max(num_layers // 4, space.layer_range(num_layers)[0])
    # the peers' published configurations, each with its own rule, pruning once after its own layer,
    # keeping the published 20% (where the space can prune that much)
    assert str(gemfilter.scoring) == "w1-raw-avg5-sum" and str(tsp.scoring) == "w8-softmax-max7-sum"
    for peer in (gemfilter, tsp):
        assert sum(p > 0 for p in peer.percentiles) == 1
        assert peer.keep_fractions()[-1] == pytest.approx(0.4 if clipped else 0.2, abs=0.03)


@pytest.mark.parametrize("num_layers", [4, 18, 30])
def test_warm_starts_hold_every_one_stage_schedule_of_the_heldout_check(num_layers: int) -> None:
    """Defect: on gemma3-270m the held-out check found one stage keeping 30% after layer 4 at 2.09x on
    test within budget, while the study, which had never evaluated it, recommended a 1.28x schedule.
    The packaged stages space now queues the whole one-stage family, each schedule exactly as the
    held-out check builds it (so the check reuses the study's losses), and queues none twice."""
    space = SPACES["stages"]
    points = space.warm_start(num_layers)
    queued = [schedule_key(space.to_schedule(p, "m", num_layers)) for p in points]
    hand_made = {schedule_key(s) for s in one_stage_grid("m", num_layers).values()}
    assert hand_made and hand_made <= set(queued)
    assert len(set(queued)) == len(queued)
    # a space that cannot hold a schedule exactly still gets its nearest point, never a repeat
    per_layer = SPACES["per_layer"]  # caps a layer at 60%: keeping 10% and 30% become one point
    extra = per_layer.hand_made_starts(num_layers, [])
    assert len(extra) == len({json.dumps(p, sort_keys=True) for p in extra}) < len(hand_made)


@pytest.mark.parametrize("num_layers", [18, 30])
def test_warm_start_paper_point_matches_paper_style(num_layers: int, tmp_path: Path) -> None:
    paper = Schedule.paper_style("m", num_layers)
    # without a grid, stages and parametric reproduce the paper-style schedule
    path = _write(tmp_path, "kind: stages\n")
    stages = load_space(path)
    assert stages.to_schedule(stages.warm_start(num_layers)[0], "m", num_layers) == paper
    parametric = SPACES["parametric"]
    got = parametric.to_schedule(parametric.warm_start(num_layers)[0], "m", num_layers)
    assert got.percentiles == pytest.approx(paper.percentiles, abs=1e-4)
    # the packaged grids of 5 round the paper's 25.98% to 25%, at the paper's layers
    for name in ("stages", "per_layer"):
        space = SPACES[name]
        got = space.to_schedule(space.warm_start(num_layers)[0], "m", num_layers)
        assert got.percentiles == tuple(25.0 if p > 0 else 0.0 for p in paper.percentiles)


def test_parametric_keep_all_only_where_the_space_holds_it(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "kind: parametric\nstart_depth_low: 0.6\nstart_depth_high: 0.9\nfinal_keep_low: 0.05\n"
        "final_keep_high: 0.2\nn_stages_low: 1\nn_stages_high: 2\nshapes: [front]\n",
    )
    space = load_space(path)
    points = space.warm_start(30)
    assert points[0] == {"start_depth": 0.6, "final_keep": 0.2, "n_stages": 2, "shape": "front"}
    # paper-style, the mid-depth family, the two peers (clipped to this space they coincide: queued
    # once), then the hand-made one-stage points this space does not already hold (clipped to start
    # 0.6 and keep <= 0.2, only keeping 10% is new); one rule: no parameter
    assert len(points) == 3 + 1 and all("scoring" not in p for p in points)
    assert points[3:] == space.hand_made_starts(30, points[:3])
    assert space.to_schedule(points[0], "m", 30).keep_fractions()[-1] == pytest.approx(0.2)


# --------------------------------------------------------------------------------------------------
# the scoring rule
def test_packaged_spaces_search_the_scoring_rules_their_yaml_declares() -> None:
    rules = ("w1-softmax-none-mean", "w8-softmax-max7-sum", "w1-raw-avg5-sum", "w1-softmax-none-mean-stage")
    for name in NAMES:
        space = SPACES[name]
        assert space.scoring == rules
        study = optuna.create_study(sampler=RandomSampler(seed=1))
        seen = set()
        for _ in range(40):
            trial = study.ask()
            schedule = space.suggest(trial, "m", 12)
            assert str(schedule.scoring) == trial.params["scoring"]  # the schedule carries the rule
            seen.add(trial.params["scoring"])
        assert seen == set(rules)
        assert study.trials[0].distributions["scoring"].choices == rules


def test_old_params_without_scoring_mean_todays_rule() -> None:
    space = SPACES["stages"]
    old = {"n_stages": 1, "stage0_layer": 3, "stage0_pct": 20.0}  # a trial of an older study
    schedule = space.to_schedule(old, "m", 6)
    assert schedule.scoring == Scoring() and "scoring" not in schedule.metadata["params"]
    fast = space.to_schedule({**old, "scoring": "fastkv"}, "m", 6)  # an alias is the same rule
    assert str(fast.scoring) == "w8-softmax-max7-sum" and fast.metadata["params"]["scoring"] == str(
        fast.scoring
    )
    with pytest.raises(ValueError, match=r"params\['scoring'\] = 'w4-raw-none-max': must be one of"):
        space.to_schedule({**old, "scoring": "w4-raw-none-max"}, "m", 6)  # a rule the space does not offer
    with pytest.raises(ValueError, match=r"params\['scoring'\] = 'nope'"):
        space.to_schedule({**old, "scoring": "nope"}, "m", 6)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("last", "scoring = 'last': must be a non-empty list"),
        ([], "scoring = []: must be a non-empty list"),
        (["last", "w9-softmax-max4-sum"], "scoring kernel = 4: a max pool needs an odd kernel >= 3"),
        (["last", "w1-softmax-none-mean"], "repeats 'w1-softmax-none-mean'"),
        (["w1-cosine-none-mean"], "scoring values = 'cosine': unknown. Available: softmax, raw"),
    ],
)
def test_bad_scoring_choices_name_the_field(tmp_path: Path, value: Any, fragment: str) -> None:
    path = _write(tmp_path, f"kind: stages\nscoring: {json.dumps(value)}\n")
    with pytest.raises(ValueError) as err:
        load_space(path)
    message = str(err.value)
    assert "\n" not in message and fragment in message and str(path) in message
