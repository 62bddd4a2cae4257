from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lazyllm.schedule import FORMAT_NAME, Revival, Schedule, num_pruned
from lazyllm.scoring import ALIASES, Scoring
from tests.support import audited


def test_rounding_rule_values() -> None:
    # floor(p * n / 100), the last position never pruned
    assert num_pruned(50.0, 7) == 3
    assert num_pruned(50.0, 8) == 4
    assert num_pruned(30.0, 10) == 3  # 30 * 10 / 100 is 2.9999999999999996 in floats; tolerance keeps it 3
    assert num_pruned(10.0, 9) == 0
    assert num_pruned(99.0, 2) == 1
    assert num_pruned(99.9, 1) == 0
    assert num_pruned(0.0, 1000) == 0
    assert num_pruned(33.0, 100) == 33


@given(p=st.floats(0, 99.999), n=st.integers(1, 10_000))
def test_rounding_rule_bounds(p: float, n: int) -> None:
    k = num_pruned(p, n)
    assert 0 <= k <= n - 1
    assert k <= p * n / 100 + 1e-6
    assert k == min(math.floor(p * n / 100 + 1e-9), n - 1)


def test_keep_counts_follow_rule() -> None:
    s = Schedule.from_layers("m", 6, {1: 50, 3: 25})
    assert s.keep_counts(101) == [101, 101, 51, 51, 39, 39]
    assert s.keep_counts(1) == [1] * 6
    fr = s.keep_fractions()
    assert fr == pytest.approx([1, 1, 0.5, 0.5, 0.375, 0.375])


def test_keep_all_and_prunes() -> None:
    s = Schedule.keep_all("m", 4)
    assert s.percentiles == (0.0,) * 4 and not s.prunes
    assert Schedule.from_layers("m", 4, {0: 10}).prunes


def test_json_round_trip_with_metadata(tmp_path) -> None:
    s = Schedule(
        "smollm2-135m", (0, 20.5, 0, 0), metadata={"study": "qa", "trial": 3, "metrics": {"loss": 0.1}}
    )
    assert Schedule.from_json(s.to_json()) == s
    path = s.save(tmp_path / "sub" / "s.json")
    loaded = Schedule.load(path)
    assert loaded == s and loaded.metadata == s.metadata
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT_NAME and data["version"] == 3 and data["num_layers"] == 4
    assert data["revival"] == {"policy": "frozen"}


revivals = st.one_of(
    st.sampled_from(["dynamic", "frozen"]).map(Revival),
    st.integers(0, 10_000).map(lambda b: Revival("budget", b)),
)


@given(st.lists(st.floats(0, 99.99, allow_nan=False), min_size=1, max_size=40), revivals)
def test_round_trip_property(values: list[float], revival: Revival) -> None:
    s = Schedule("m", (*tuple(values[:-1]), 0.0), revival=revival)
    assert Schedule.from_json(s.to_json()) == s
    assert Revival.parse(str(revival)) == revival


def test_revival_policy_is_part_of_the_schedule() -> None:
    s = Schedule("m", (0, 50, 0), revival="dynamic")
    assert s.revival == Revival("dynamic") and s.revival.revives
    frozen = s.with_revival("frozen")
    assert frozen != s and frozen.percentiles == s.percentiles and not frozen.revival.revives
    # one default everywhere: the tuner's (what every study measured), not the paper's
    assert Schedule("m", (0, 50, 0)) == frozen and Revival() == Revival("frozen")
    assert Schedule("m", (0, 50, 0), revival="budget:8").revival == Revival("budget", 8)
    assert json.loads(s.with_revival("budget:8").to_json())["revival"] == {"policy": "budget", "budget": 8}


def test_version_1_files_load_as_dynamic(tmp_path) -> None:
    v1 = '{"format": "lazyllm-schedule", "version": 1, "model": "m", "num_layers": 3, "percentiles": [0, 40, 0]}'
    s = Schedule.from_json(v1)
    assert s == Schedule("m", (0, 40, 0), revival="dynamic") and s.revival == Revival("dynamic")
    assert json.loads(s.to_json())["version"] == 3  # written back in the current version...
    assert Schedule.from_json(s.to_json()).revival == Revival("dynamic")  # ...still meaning dynamic
    with pytest.raises(ValueError, match="unknown field"):  # version 1 never had a revival field
        Schedule.from_json(v1[:-1] + ', "revival": {"policy": "frozen"}}')


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("policy", ["dynamic", "frozen", "budget:8"])
def test_older_files_keep_their_policy_whatever_the_default(tmp_path, version: int, policy: str) -> None:
    # files written while the default was dynamic carry their policy: loading one after the default
    # changed, and writing it back, keeps what it meant
    revival = Revival.parse(policy).to_dict()
    data = {"format": FORMAT_NAME, "version": version, "model": "m", "num_layers": 3,
            "percentiles": [0, 40, 0], "revival": revival}  # fmt: skip
    if version == 3:
        data["scoring"] = Scoring().to_dict()
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    s = Schedule.load(path)
    assert s.revival == Revival.parse(policy)
    again = Schedule.load(s.save(tmp_path / "again.json"))
    assert again == s and json.loads((tmp_path / "again.json").read_text())["revival"] == revival


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("sometimes", "revival policy = 'sometimes': unknown. Available: dynamic, frozen, budget"),
        ("budget", "write the budget as 'budget:N'"),
        ("budget:-1", "budget:N"),
        ("budget:x", "budget:N"),
        ("frozen:3", "only 'budget:N' takes a number"),
    ],
)
def test_invalid_revival(value: str, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        Schedule("m", (0, 0), revival=value)
    assert fragment in str(err.value)
    with pytest.raises(ValueError, match="only policy 'budget' takes a budget"):
        Revival("frozen", 3)
    with pytest.raises(ValueError, match="must be an object"):
        Schedule.from_json(
            Schedule("m", (0,)).to_json().replace('{\n    "policy": "frozen"\n  }', '"frozen"')
        )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(model="m", percentiles=(0, 120, 0)), "percentiles[1] = 120"),
        (dict(model="m", percentiles=(0, -1, 0)), "percentiles[1] = -1"),
        (dict(model="m", percentiles=(0, 100, 0)), "percentiles[1] = 100"),
        (dict(model="m", percentiles=(0, float("nan"), 0)), "percentiles[1] = nan"),
        (dict(model="m", percentiles=(0, "5", 0)), "percentiles[1] = '5'"),
        (dict(model="m", percentiles=(0, True, 0)), "percentiles[1] = True"),
        (dict(model="m", percentiles=(0, 0, 30)), "percentiles[2] = 30.0: the last layer"),
        (dict(model="m", percentiles=()), "percentiles = []"),
        (dict(model="", percentiles=(0,)), "model = ''"),
        (dict(model="m", percentiles=(0,), metadata={"x": float("inf")}), "metadata['x']"),
        (dict(model="m", percentiles=(0,), metadata={"x": object()}), "metadata['x']"),
    ],
)
def test_invalid_schedules(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        Schedule(**kwargs)
    assert fragment in str(err.value)


def _doc(**fields: object) -> str:
    data: dict[str, object] = {"format": FORMAT_NAME, "version": 1, "model": "m", "num_layers": 2,
                               "percentiles": [10.0, 0]}  # fmt: skip
    data.update(fields)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{", "not valid JSON"),
        ("[1, 2]", "must be an object"),
        ('{"format": "other"}', "format = 'other'"),
        ('{"format": "lazyllm-schedule", "version": 4}', "version = 4"),
        (
            '{"format": "lazyllm-schedule", "version": 2, "model": "m", "num_layers": 1, "percentiles": [0]}',
            "missing field 'revival'",
        ),
        (
            '{"format": "lazyllm-schedule", "version": 1, "model": "m", "num_layers": 3, "percentiles": [0, 0]}',
            "num_layers = 3 but percentiles has 2",
        ),
        (
            '{"format": "lazyllm-schedule", "version": 1, "model": "m", "num_layers": 1}',
            "missing field 'percentiles'",
        ),
        (
            '{"format": "lazyllm-schedule", "version": 1, "model": "m", "num_layers": 1, "percentiles": [0], "x": 1}',
            "unknown field",
        ),
        (
            '{"format": "lazyllm-schedule", "version": 1, "model": "m", "num_layers": 2, "percentiles": [NaN, 0]}',
            "NaN is not a JSON number",
        ),
        # strict types: JSON's true is not the integer 1, -0.0 is not a percentile in [0, 100)
        (_doc(version=True), "version = True: must be an integer"),
        (_doc(version=1.0), "version = 1.0: must be an integer"),
        (_doc(percentiles=[-0.0, 0]), "percentiles[0] = -0.0"),
        ('{"format": "lazyllm-schedule", "format": "lazyllm-schedule"}', "duplicate key 'format'"),
        (_doc(metadata={"a": 1}).replace('"a": 1', '"a": 1, "a": 2'), "duplicate key 'a'"),
        # bounded nesting: ~600 lists deep used to raise RecursionError from a 1.4 KB file
        (_doc(metadata={"x": []}).replace("[]", "[" * 600 + "]" * 600), "nested more than 32 levels"),
        (_doc(metadata={"x": []}).replace("[]", "[" * 100_000 + "]" * 100_000), "nested more than 32 levels"),
    ],
)
def test_invalid_json(text: str, fragment: str) -> None:
    assert len(text) < 1_000_000 or fragment.startswith("nested")
    with pytest.raises(ValueError) as err:
        Schedule.from_json(text)
    assert fragment in str(err.value)


def test_load_errors_name_the_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="cannot read schedule file"):
        Schedule.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"format": "lazyllm-schedule", "version": 1, "model": "m", "num_layers": 2, "percentiles": [0, 120]}'
    )
    with pytest.raises(ValueError, match=r"bad\.json: percentiles\[1\] = 120"):
        Schedule.load(bad)


def test_loader_limits_and_bom(tmp_path) -> None:
    good = Schedule("m", (10.0, 0.0), metadata={"deep": [[[[1]]]]})
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + good.to_json().encode())  # editors on Windows add a BOM
    assert Schedule.load(path) == good
    assert Schedule.from_json("\ufeff" + good.to_json()) == good
    big = tmp_path / "big.json"
    big.write_text(_doc(metadata={"pad": "x" * 1_200_000}))
    with (
        audited("open") as opened,
        pytest.raises(ValueError, match=r"big\.json is 1\.2 MB; a schedule is at most 1 MB"),
    ):
        Schedule.load(big)
    assert [args for args in opened if str(args[0]) == str(big)] == []  # refused by its size: never opened
    with pytest.raises(ValueError, match="at most 1000000"):
        Schedule.from_json(_doc(metadata={"pad": "x" * 1_200_000}))
    # metadata built in Python is bounded too (no RecursionError from the validator)
    deep: list[object] = []
    for _ in range(2000):
        deep = [deep]
    with pytest.raises(ValueError, match="nested more than 32 levels"):
        Schedule("m", (0.0,), metadata={"x": deep})
    Schedule("m", (0.0,), metadata={"x": [[[[[[[[[[1]]]]]]]]]]})  # shallow nesting is fine


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(
    st.one_of(
        st.text(max_size=50),
        json_values.map(json.dumps),
        st.fixed_dictionaries(
            {"format": st.just(FORMAT_NAME), "version": st.just(1)},
            optional={
                "model": json_values,
                "num_layers": json_values,
                "percentiles": json_values,
                "metadata": json_values,
            },
        ).map(json.dumps),
        # deep nesting, a BOM, a loosely typed version, repeated keys
        st.integers(1, 5000).map(lambda n: _doc(metadata={"x": []}).replace("[]", "[" * n + "]" * n)),
        st.text(max_size=50).map(lambda t: "\ufeff" + t),
        json_values.map(lambda v: _doc(version=v)),
        json_values.map(lambda v: _doc().replace('"model": "m"', f'"model": "m", "model": {json.dumps(v)}')),
    )
)
def test_loader_fuzz_raises_only_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        Schedule.from_json(text)


def test_check_model() -> None:
    s = Schedule.keep_all("smollm2-135m", 30)
    s.check_model("smollm2-135m", 30)
    with pytest.raises(ValueError, match="30 layers, but model 'other' has 24 layers"):
        s.check_model("other", 24)
    with pytest.raises(ValueError, match="not 'other'"):
        s.check_model("other", 30)
    s.check_model("other", 30, strict_name=False)


# --------------------------------------------------------------------------------------------------
# scoring rules (version 3)
def test_v3_round_trip_keeps_the_scoring_rule(tmp_path) -> None:
    s = Schedule.from_layers("m", 4, {1: 40}).with_scoring("fastkv").with_revival("frozen")
    assert s.scoring == Scoring(window=8, pool="max", kernel=7, heads="sum")
    data = json.loads(s.to_json())
    assert data["version"] == 3 and data["scoring"] == {
        "window": 8,
        "values": "softmax",
        "pool": "max",
        "kernel": 7,
        "heads": "sum",
        "layers": "layer",
    }
    assert Schedule.from_json(s.to_json()) == s
    assert Schedule.load(s.save(tmp_path / "s.json")).scoring == s.scoring
    assert s != s.with_scoring("last")  # the rule is part of the schedule's identity


@pytest.mark.parametrize("version", [1, 2])
def test_v1_and_v2_files_load_with_the_last_token_rule(version: int) -> None:
    revival = ', "revival": {"policy": "frozen"}' if version == 2 else ""
    text = f'{{"format": "lazyllm-schedule", "version": {version}, "model": "m", "num_layers": 3, "percentiles": [0, 40, 0]{revival}}}'
    s = Schedule.from_json(text)
    assert s.scoring == Scoring() and str(s.scoring) == "w1-softmax-none-mean"
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['scoring'\]"):
        Schedule.from_json(text[:-1] + ', "scoring": {"window": 8}}')  # v1/v2 have no scoring field


@pytest.mark.parametrize(
    ("scoring", "fragment"),
    [
        ({"window": 0}, "scoring window = 0: must be an integer in 1..64"),
        ({"window": 2.5}, "scoring window = 2.5"),
        ({"values": "probs"}, "scoring values = 'probs': unknown. Available: softmax, raw"),
        ({"pool": "min", "kernel": 3}, "scoring pool = 'min': unknown. Available: none, avg, max"),
        ({"pool": "max", "kernel": 4}, "scoring kernel = 4: a max pool needs an odd kernel >= 3"),
        ({"kernel": 5}, "scoring kernel = 5: pool 'none' takes kernel 1"),
        ({"heads": "median"}, "scoring heads = 'median': unknown. Available: mean, sum, max"),
        ({"layers": "all"}, "scoring layers = 'all': unknown. Available: layer, stage"),
        ({"widow": 8}, "scoring = {'widow': 8}: must be an object with keys from"),
        ("fastkv", "scoring = 'fastkv': must be an object"),
    ],
)
def test_bad_scoring_is_one_line_naming_the_field(scoring: object, fragment: str) -> None:
    data = {
        "format": "lazyllm-schedule",
        "version": 3,
        "model": "m",
        "num_layers": 2,
        "percentiles": [30, 0],
        "revival": {"policy": "dynamic"},
        "scoring": scoring,
    }
    with pytest.raises(ValueError) as err:
        Schedule.from_json(json.dumps(data))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_scoring_spellings_parse_and_print() -> None:
    for alias, spelled in ALIASES.items():
        assert str(Scoring.parse(alias)) == spelled
        assert Scoring.parse(spelled) == Scoring.parse(alias)
    rule = Scoring(window=4, values="raw", pool="avg", kernel=3, heads="max", layers="stage")
    assert Scoring.parse(str(rule)) == rule
    for bad in ("w0-softmax-none-mean", "softmax", "w8-softmax-max-sum", "w8-softmax-none-mean-all"):
        with pytest.raises(ValueError, match="scoring"):
            Scoring.parse(bad)
    with pytest.raises(ValueError, match=r"scoring = 'nope'"):
        Schedule("m", (0.0,), scoring="nope")
