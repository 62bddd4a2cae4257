"""tuner.study.settings: one model of what to evaluate on, shared by search and evaluate; flags from fields."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import pytest

from tuner.evaluate import _parser as evaluate_parser
from tuner.evaluate import settings_from_args as evaluate_settings
from tuner.search import parse_settings
from tuner.study.samplers import SAMPLERS, make_sampler, sampler_names
from tuner.study.settings import (
    EvalSettings,
    EvaluateSettings,
    FreshSource,
    SearchSettings,
    add_flags,
    load_preset,
    resolve_settings,
)
from tuner.study.spaces import load_space


def test_search_and_evaluate_share_the_evaluation_fields() -> None:
    shared = set(EvalSettings.__dataclass_fields__)
    assert shared <= set(SearchSettings.__dataclass_fields__)
    assert shared <= set(EvaluateSettings.__dataclass_fields__)
    # one default for truncation and answer length in both
    s, e = SearchSettings(), EvaluateSettings(methods="baseline")
    assert (s.max_prompt_tokens, s.max_new_tokens) == (e.max_prompt_tokens, e.max_new_tokens) == (1024, 32)
    assert (s.split, e.split) == ("validation", "test")
    # the evaluation part of a search is what the baseline cache and the examples depend on
    assert s.eval_only() == EvalSettings(n_examples=s.n_examples)
    assert s.with_split("test") == EvalSettings(n_examples=s.n_examples, split="test")
    assert type(s.eval_only()) is EvalSettings  # the baseline cache keys on these fields only


def test_one_preset_describes_the_same_examples_to_both(tmp_path: Path) -> None:
    preset = tmp_path / "p.yaml"
    preset.write_text(
        "task: multi-doc-qa\nn_examples: 3\nmax_prompt_tokens: 512\nn_trials: 9\nmethods: baseline\n"
    )
    search = parse_settings(["--preset", str(preset)])
    report = evaluate_settings(evaluate_parser().parse_args(["--preset", str(preset)]))
    for name in ("task", "n_examples", "max_prompt_tokens"):
        assert getattr(search, name) == getattr(report, name)
    assert search.n_trials == 9 and report.method_list == ["baseline"]
    assert load_preset(str(preset), EvaluateSettings) == {
        "task": "multi-doc-qa", "n_examples": 3, "max_prompt_tokens": 512, "methods": "baseline"
    }  # fmt: skip
    # flags override the preset
    assert (
        evaluate_settings(
            evaluate_parser().parse_args(["--preset", str(preset), "--n-examples", "2"])
        ).n_examples
        == 2
    )


def test_evaluate_output_is_derived_from_the_settings() -> None:
    a = EvaluateSettings(methods="baseline", task="qa")
    b = EvaluateSettings(methods="baseline", task="summarization")
    c = EvaluateSettings(methods="baseline", task="qa", split="validation")
    assert a.out_dir == Path("outputs/evaluate/smollm2-135m-qa-test")
    assert len({a.out_dir, b.out_dir, c.out_dir}) == 3
    assert EvaluateSettings(methods="baseline", output="x").out_dir == Path("x")
    folder = EvaluateSettings(methods="baseline", model="/models/my model/", task="qa,trec").out_dir
    assert folder == Path("outputs/evaluate/my-model-qa-trec-test")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"max_accuracy_loss": math.nan}, "max_accuracy_loss = nan: must be a finite number"),
        ({"max_accuracy_loss": math.inf}, "must be a finite number"),
        ({"max_accuracy_loss": -1.0}, "must be >= 0"),
        ({"trials_timeout": math.nan}, "trials_timeout = nan"),
        ({"trials_timeout": 0.0}, "must be > 0"),
        ({"task": "bogus"}, "Unknown task 'bogus'"),
        ({"language": "fr"}, "language = 'fr'"),
        ({"sampler": "bogus"}, "Unknown sampler 'bogus'. Available: gp, nsga2, random, tpe"),
        ({"split": "test"}, "a study searches on 'validation'"),
        ({"model": " "}, "model is empty"),
        ({"dtype": "fp16"}, "dtype = 'fp16': must be one of auto, float32, bfloat16, float16"),
        ({"search_max_kl": 0.0}, "search_max_kl = 0.0: must be > 0"),
        ({"search_max_kl": math.nan}, "search_max_kl = nan: must be a finite number"),
    ],
)
def test_search_settings_refuse_bad_values(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        SearchSettings(**kwargs)  # type: ignore[arg-type]


def test_evaluate_settings_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match=r"Unknown method 'bogus'\. Available: baseline, compression"):
        EvaluateSettings(methods="baseline,bogus")
    with pytest.raises(ValueError, match="--schedule is needed"):
        EvaluateSettings(methods="baseline,lazyllm")
    with pytest.raises(ValueError, match="methods is empty"):
        EvaluateSettings(methods=" , ")


def test_a_preset_key_given_twice_is_refused_like_in_a_search_space(tmp_path: Path) -> None:
    """Presets and search spaces are read by one strict loader (tuner.study.strict_yaml): the second
    ``n_trials`` used to win silently."""
    preset = tmp_path / "twice.yaml"
    preset.write_text("task: qa\nn_trials: 4\nmax_prompt_tokens: 512\nn_trials: 40\n")
    with pytest.raises(ValueError) as info:
        resolve_settings(str(preset), {})
    message = str(info.value)
    assert "'n_trials' is given twice" in message and str(preset) in message and "\n" not in message
    space = tmp_path / "space.yaml"
    space.write_text("kind: stages\nkind: stages\n")
    with pytest.raises(ValueError, match="'kind' is given twice"):
        load_space(str(space))


def test_preset_types_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    for text, fragment in (
        ("n_trials: ten\n", "n_trials = 'ten': must be int"),
        ("n_trials: true\n", "n_trials = True: must be int"),
        ("n_examples: 1.5\n", "n_examples = 1.5: must be int or null"),
        ("heldout: 1\n", "heldout = 1: must be bool"),
        ("- a\n- b\n", "must be a mapping"),
        ("n_trails: 5\n", r"unknown setting\(s\) \['n_trails'\]"),
    ):
        bad.write_text(text)
        with pytest.raises(ValueError, match=fragment):
            resolve_settings(str(bad), {})
    default = SearchSettings().n_examples
    assert (
        resolve_settings(None, {"n_examples": None, "n_trials": 3}).n_examples == default
    )  # None = not given
    assert resolve_settings(None, {"n_examples": 2}).n_examples == 2


def test_flags_are_made_from_the_fields() -> None:
    p = argparse.ArgumentParser()
    add_flags(p, SearchSettings, exclude={"split"})
    args = vars(p.parse_args(["--no-heldout", "--max-accuracy-loss", "1.5", "--n-examples", "3"]))
    assert set(args) == set(SearchSettings.__dataclass_fields__) - {"split"}
    assert (args["heldout"], args["max_accuracy_loss"], args["n_examples"], args["n_trials"]) == (
        False,
        1.5,
        3,
        None,
    )
    with pytest.raises(SystemExit):
        p.parse_args(["--sampler", "bogus"])  # choices come from the sampler registry


def test_sampler_registry() -> None:
    assert sampler_names() == sorted(SAMPLERS) == ["gp", "nsga2", "random", "tpe"]
    for name in SAMPLERS:
        assert make_sampler(name, seed=0, n_trials=12) is not make_sampler(name, seed=0, n_trials=12)
    with pytest.raises(ValueError, match=r"Unknown sampler 'cma'\. Available: gp, nsga2, random, tpe"):
        make_sampler("cma", 0, 10)


def test_accuracy_modes_are_defined_once() -> None:
    """One definition (tuner.study.settings); tuner.study.records imports it instead of keeping a copy."""
    import ast

    import tuner.study.records
    import tuner.study.settings

    folder = Path(tuner.study.settings.__file__).parent
    defining = sorted(
        path.name
        for path in folder.glob("*.py")
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "ACCURACY_MODES" for t in node.targets)
    )
    assert defining == ["settings.py"]
    assert tuner.study.records.ACCURACY_MODES is tuner.study.settings.ACCURACY_MODES


@pytest.mark.parametrize("module", ["tuner.search", "tuner.evaluate"])
def test_help_never_shows_a_default_twice(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A help text that names its own default (``$LONGBENCH_DIR``, ``<model>-<task>-<search space>``)
    gets no second ``(default: None)`` from the field."""
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(module).main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines; compare words
    assert "(default: $LONGBENCH_DIR, else the records packaged with the project" in text
    assert "(default: 1024)" in text
    assert re.findall(r"\(default[^()]*\)\s*\(default[^()]*\)", text) == []


def test_confirmation_and_heldout_examples_fall_back_to_the_search() -> None:
    from tuner.study.settings import SearchSettings

    s = SearchSettings(n_examples=5)
    assert (
        s.evidence_settings("confirm").n_examples == 5
        and s.evidence_settings("confirm").split == "validation"
    )
    assert s.evidence_settings("heldout").n_examples == 5 and s.evidence_settings("heldout").split == "test"
    more = SearchSettings(n_examples=5, confirm_n_examples=100, heldout_n_examples=150)
    assert more.evidence_settings("confirm").n_examples == 100
    assert more.evidence_settings("heldout").n_examples == 150
    with pytest.raises(ValueError, match="confirm_n_examples = 0: must be >= 1"):
        SearchSettings(confirm_n_examples=0)


def test_the_fresh_drift_check_reads_local_open_qa_prompts_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its prompts: open-QA validation at the study's length, ``fresh_kl_examples`` per dataset, from
    --openqa-dir, $OPENQA_DIR or the packaged pool (never the hub unasked); or why there are none."""
    from tuner.study.settings import SearchSettings

    monkeypatch.delenv("OPENQA_DIR", raising=False)
    packaged = SearchSettings().fresh_source()
    assert packaged.kind == "open-qa" and packaged.settings is not None
    assert (packaged.settings.openqa_dir, packaged.settings.n_examples) == ("packaged", 12)
    source = SearchSettings(openqa_dir=str(tmp_path), max_prompt_tokens=700, split_seed=3).fresh_source()
    got = source.settings
    assert source.kind == "open-qa" and got is not None
    assert (got.task, got.split, got.n_examples, got.max_prompt_tokens, got.split_seed) == (
        "openqa", "validation", 12, 700, 3,
    )  # fmt: skip
    monkeypatch.setenv("OPENQA_DIR", str(tmp_path))
    assert SearchSettings(fresh_kl_examples=5).fresh_source().kind == "open-qa"
    assert SearchSettings(fresh_kl_examples=0).fresh_source().reason == "off (--fresh-kl-examples 0)"
    assert SearchSettings(task="squad-long").fresh_source() == FreshSource("calibration")
    for kind, extra, message in (
        ("none", {}, "a reason goes with 'none'"),
        ("calibration", {"reason": "x"}, "a reason goes with 'none' and only with it"),
        ("open-qa", {}, "settings go with 'open-qa'"),
        ("file", {}, "settings go with 'open-qa' and 'file'"),
        ("calibration", {"settings": got}, "settings go with 'open-qa' and 'file' and only with them"),
        ("hub", {}, "must be one of open-qa, file, calibration, none"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            FreshSource(kind, **extra)
    with pytest.raises(
        ValueError, match=r"fresh_kl_examples = -1: must be >= 0 \(0 = no fresh-prompt check\)"
    ):
        SearchSettings(fresh_kl_examples=-1)


# ---- issue 32 item 5: bounds that make no sense are refused, before anything is written ------------


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--confidence", "0.5", "--decision-level", "0.6"], "decision_level = 0.6: must be in [0.5, confidence = 0.5]"),
        (["--confirm-k", "1000"], "confirm_k = 1000: must be in 0..6 (0 = no confirmation)"),
        (["--n-trials", "40", "--confirm-k", "41"], "confirm_k = 41: must be in 0..40"),
        (["--task", "qa,,hotpotqa"], "task = 'qa,,hotpotqa': a comma list with an empty part"),
        (["--task", "hotpotqa,"], "a comma list with an empty part"),
        (["--max-prompt-tokens", "10000000"],
         "max_prompt_tokens = 10000000: above what the model's 4096-token context holds with 2 new tokens "
         "(4094); pass --max-prompt-tokens 4094 or less"),
    ],
)  # fmt: skip
def test_senseless_bounds_are_refused_and_nothing_is_written(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], fragment: str
) -> None:
    from tests.support import longbench_dir
    from tuner.search import main as search

    out = tmp_path / "out"
    argv = ["--model", str(tiny_folder), "--task", "hotpotqa", "--n-examples", "1", "--max-prompt-tokens", "64",
            "--max-new-tokens", "2", "--data-dir", longbench_dir(), "--output", str(out), "--n-trials", "3",
            *flags]  # fmt: skip
    assert search(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not out.exists()


def test_bounds_that_make_sense_pass() -> None:
    assert SearchSettings(confidence=0.6, decision_level=0.6).decision_level == 0.6
    assert SearchSettings(n_trials=2).confirm_k == 6  # the default, whatever n_trials
    assert SearchSettings(n_trials=100, confirm_k=100).confirm_k == 100
    assert SearchSettings(task="hotpotqa, trec").task == "hotpotqa, trec"


def test_the_loaded_models_context_is_checked_too(tiny_folder: Path) -> None:
    """A hub model's config is known only once it loads: the Evaluator checks it before any example."""
    from lazyllm.models import load_model
    from tests.support import longbench_dir
    from tuner.evaluation.runner import Evaluator
    from tuner.study.context import check_context

    model, tokenizer = load_model(str(tiny_folder))
    config = EvalSettings(
        model=str(tiny_folder), task="trec", max_prompt_tokens=5000, data_dir=longbench_dir()
    )
    with pytest.raises(ValueError, match=r"max_prompt_tokens = 5000: above .* 4096-token context"):
        Evaluator(model, tokenizer, config, Path("never-written"), progress=False)
    assert not Path("never-written").exists()

    check_context(8188, 4, 8192)
    check_context(10**7, None, None)  # a model that names no context
    with pytest.raises(ValueError, match=r"max_prompt_tokens = 8189: .* 8192-token context .* 4 new tokens"):
        check_context(8189, 4, 8192)


def test_a_setting_that_may_be_null_takes_none_on_the_command_line(tmp_path: Path) -> None:
    """Every numeric setting whose help says what none means can be set to none, over a preset too."""
    preset = tmp_path / "p.yaml"
    preset.write_text("n_examples: 3\nmax_new_tokens: 16\ntrials_timeout: 60\nconfirm_n_examples: 5\n")
    given = parse_settings(["--preset", str(preset)])
    assert (given.n_examples, given.max_new_tokens, given.trials_timeout, given.confirm_n_examples) == (
        3,
        16,
        60,
        5,
    )
    flags = ["--n-examples", "none", "--max-new-tokens", "None", "--trials-timeout", "null"]
    nulled = parse_settings(["--preset", str(preset), *flags, "--confirm-n-examples", "none"])
    assert (nulled.n_examples, nulled.max_new_tokens, nulled.trials_timeout, nulled.confirm_n_examples) == (
        None, None, None, None
    )  # fmt: skip
    assert (
        SearchSettings().trials_timeout == 420
        and parse_settings(["--trials-timeout", "none"]).trials_timeout is None
    )
    for name in ("n_examples", "max_new_tokens", "trials_timeout", "heldout_n_examples", "timed_new_tokens"):
        field = SearchSettings.__dataclass_fields__[name]
        assert "none = " in field.metadata["help"] or "/ none" in field.metadata["help"], name
    # a text setting keeps "none" as text: it means "off" for the tracking URI
    assert parse_settings(["--tracking-uri", "none"]).tracking_uri == "none"
    evaluated = evaluate_settings(
        evaluate_parser().parse_args(["--methods", "baseline", "--n-examples", "none"])
    )
    assert evaluated.n_examples is None
    with pytest.raises(SystemExit):  # anything else is still an int
        parse_settings(["--n-examples", "nothing"])


def test_renamed_settings_say_what_they_bound_and_keep_their_old_spelling(tmp_path: Path) -> None:
    """--trials-timeout bounds the trials only (Optuna's timeout bounds a whole optimize call);
    --timed-new-tokens cannot be taken for --max-new-tokens. The old spellings still work, deprecated."""
    assert parse_settings(["--trials-timeout", "90"]).trials_timeout == 90
    with pytest.warns(FutureWarning, match="--timeout is deprecated; it is now --trials-timeout"):
        assert parse_settings(["--timeout", "90"]).trials_timeout == 90  # the old flag
    assert parse_settings(["--timed-new-tokens", "7"]).timed_new_tokens == 7
    with pytest.warns(FutureWarning, match="--new-tokens is deprecated; it is now --timed-new-tokens"):
        assert parse_settings(["--new-tokens", "7"]).timed_new_tokens == 7
    assert not {"timeout", "new_tokens"} & set(SearchSettings.__dataclass_fields__)
    old = tmp_path / "old.yaml"
    old.write_text("timeout: 90\nnew_tokens: 7\n")
    with pytest.warns(FutureWarning, match="'timeout' is deprecated; it is now 'trials_timeout'"):
        settings = parse_settings(["--preset", str(old)])
    assert (settings.trials_timeout, settings.timed_new_tokens) == (90, 7)
    both = tmp_path / "both.yaml"
    both.write_text("timeout: 90\ntrials_timeout: 60\n")
    with pytest.raises(ValueError, match="'timeout' is the old name of 'trials_timeout'; give only"):
        parse_settings(["--preset", str(both)])
