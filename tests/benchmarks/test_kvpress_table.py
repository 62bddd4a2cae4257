"""benchmarks/kvpress_table.py and its worker on tiny random models: the KV-bytes accounting against the
engine's own cache, the context/question split, the worker's KL against the fidelity's, the merge of a
worker line, and a whole run (the worker a real subprocess, under this venv, without a press) that
resumes without computing anything twice.

kvpress itself lives in ``.venv-kvpress`` (``make kvpress-setup``), which CI does not build: the presses'
rows run only there (docs/benchmarks.md). Everything this side does with the worker's lines is tested
here on the worker's real output."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig

from lazyllm import LazyLLM, Schedule
from lazyllm.flops import ModelDims
from lazyllm.methods import make_method
from lazyllm.peers.tsp import TokenSelectivePropagation
from lazyllm.text import StopCriteria
from tests.support import load_benchmark, make_tiny
from tests.tuner.data.test_openqa import _hotpot, _squad
from tuner.data.longbench import encode_prompt
from tuner.data.openqa import FILES, PROMPTS
from tuner.evaluation.fidelity import drift, reference_from_logits
from tuner.evaluation.runner import Example, score_prediction

table = load_benchmark("kvpress_table")
worker = load_benchmark("kvpress_worker")


def _engine_cache(engine: LazyLLM, ids: torch.Tensor) -> tuple[list[int], int]:
    """Tokens per layer and bytes of keys and values the engine's own store holds after the prefill."""
    gen = engine.begin(ids, ids.shape[1], store_kv=True, trace=False)
    engine.forward_pass(gen, ids, 0)
    tokens = [layer.length for layer in gen.state.kv]
    stored = sum(
        2 * layer.keys[:, :, : layer.length].numel() * layer.keys.element_size()
        for layer in gen.state.kv
        if layer.keys is not None
    )
    return tokens, stored


@pytest.mark.parametrize("scoring", ["w1-softmax-none-mean", "fastkv", "gemfilter"])
def test_kv_bytes_of_a_frozen_schedule_are_the_engine_cache(scoring: str) -> None:
    model = make_tiny("llama")
    layers = int(model.config.num_hidden_layers)
    schedule = Schedule.from_layers("tiny-llama", layers, {1: 30, 3: 45}).with_scoring(scoring)
    spec = table.Spec("pick", "lazyllm", "lazyllm", schedule.with_revival("frozen"))
    engine = LazyLLM(model, spec.schedule, strict_model_name=False)
    ids = torch.randint(0, 97, (1, 61))
    tokens, stored = _engine_cache(engine, ids)
    counted = table.kv_tokens(spec, engine, 61, layers)
    assert counted == tokens and tokens[0] == 61 and tokens[-1] < 61
    assert sum(counted) * table.bytes_per_token_layer(model) == stored


def test_kv_bytes_of_tsp_are_its_engine_cache() -> None:
    model = make_tiny("llama")
    layers = int(model.config.num_hidden_layers)
    spec = table.Spec("tsp", "lazyllm", "tsp", options={"budget": 0.3})
    tsp = make_method("tsp", model, None, None, options=spec.options)
    assert isinstance(tsp, TokenSelectivePropagation)
    engine = LazyLLM(model, tsp.schedule(50).with_revival("frozen"), strict_model_name=False)
    tokens, stored = _engine_cache(engine, torch.randint(0, 97, (1, 50)))
    assert table.kv_tokens(spec, tsp, 50, layers) == tokens
    assert sum(tokens) * table.bytes_per_token_layer(model) == stored


def test_presses_run_at_the_ratios_asked(tiny_folder: Path) -> None:
    pick = Schedule.from_layers(str(tiny_folder), 4, {1: 30})
    dims = ModelDims.from_config(AutoConfig.from_pretrained(tiny_folder))
    names = [
        s.name
        for s in table.plan(pick, str(tiny_folder), dims, [200], ["snapkv"], table.press_ratios("pick"))
    ]
    assert [n for n in names if n.startswith("kvpress")] == ["kvpress snapkv (pick's KV)"]
    default = {s.name: s.ratio for s in table.plan(pick, str(tiny_folder), dims, [200], ["snapkv"])}
    assert default["kvpress snapkv (50% KV)"] == 0.5 and 0 < default["kvpress snapkv (pick's KV)"] < 0.5
    assert table.press_ratios("pick, 0.25") == [None, 0.25]
    for bad in ("", "half", "1.5"):
        with pytest.raises(ValueError):
            table.press_ratios(bad)


def test_the_split_cuts_the_prompt_before_its_question(tiny_folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    text = PROMPTS.template("squad-long").format(
        context="Question: a decoy inside the passages. Paris is in France.", input="Where is Paris?"
    )
    ids = encode_prompt(tokenizer, text, True, 512)
    marker = tokenizer(table.QUESTION_MARKER, add_special_tokens=False)["input_ids"]
    context, question = table.split_prompt(ids, marker)
    assert context + question == ids
    tail = str(tokenizer.decode(question))
    assert tail.startswith("Question: Where is Paris?\nAnswer:") and "assistant" in tail  # the chat tail too
    assert "decoy" in tokenizer.decode(context)  # the last marker, not the first
    with pytest.raises(ValueError, match="Question:"):
        table.split_prompt(ids[: len(context)][-20:], marker)


def test_the_worker_kl_is_the_fidelity_kl() -> None:
    torch.manual_seed(0)
    ref_logits, logits = 3 * torch.randn(5, 300), 3 * torch.randn(5, 300)
    logits[2] = ref_logits[2]  # one step that agrees
    answer = ref_logits.argmax(-1).tolist()
    for k in (1, 16, 64):
        expected = drift(reference_from_logits(answer, ref_logits, k), logits)
        assert worker.drift(ref_logits, logits, k) == pytest.approx(expected, abs=1e-12)
        assert worker.drift(ref_logits, ref_logits, k) == (0.0, 1.0)


def _example() -> Any:
    return Example("squad-long", "q1", tuple(range(40)), ("Paris",), None, 8, ("\n",))


def test_a_worker_line_is_scored_as_the_tuner_scores(tiny_folder: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_folder)
    ex = _example()
    spec = table.Spec("kvpress tova (50% KV)", "kvpress", "press", press="TOVAPress", ratio=0.5)
    ids = tokenizer(" Paris\nLyon", add_special_tokens=False)["input_ids"]
    stop = StopCriteria(frozenset({tokenizer.eos_token_id}), ("\n",), tokenizer)
    line = {"kind": "example", "method": spec.name, "example": ex.key, "token_ids": ids,
            "kv_bytes": 300, "kv_tokens": [10, 10], "kl": 0.25, "top1": 0.5, "seconds": 1.0}  # fmt: skip
    row = table.merge_worker_line(line, spec, ex, 30, stop, 0.0, None, 1200)
    assert row["prediction"] == " Paris" and row["score"] == score_prediction(ex, " Paris") == 1.0
    assert (row["kl"], row["kv_bytes"], row["kv_bytes_unpruned"], row["flop_speedup"]) == (
        0.25,
        300,
        1200,
        1.0,
    )
    assert (row["method"], row["example"], row["new_tokens"], row["context_tokens"]) == (
        spec.name,
        ex.key,
        len(ids),
        30,
    )
    with pytest.raises(ValueError, match="is not"):
        table.merge_worker_line({**line, "example": "squad-long/q2"}, spec, ex, 30, stop, 0.0, None, 1200)
    with pytest.raises(ValueError, match="tokens for a limit"):
        table.merge_worker_line({**line, "token_ids": ids * 9}, spec, ex, 30, stop, 0.0, None, 1200)


PER_TOKEN_LAYER = 2 * 2 * 8 * 4
"""tiny_folder's keys and values of one token in one layer: 2 x 2 KV heads x head_dim 8 x 4 bytes (float32)."""


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_run_records_every_row_and_resumes(tiny_folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "open-qa"
    data.mkdir()
    (data / FILES["hotpotqa-long"]).write_text(json.dumps(_hotpot()))
    (data / FILES["squad-long"]).write_text(json.dumps(_squad()))
    pick = (
        Schedule.from_layers(str(tiny_folder), 4, {1: 30}).with_scoring("fastkv").save(tmp_path / "pick.json")
    )
    out = tmp_path / "rows.jsonl"
    argv = [
        "--model", str(tiny_folder), "--openqa-dir", str(data), "--n", "2", "--pick", str(pick),
        "--max-prompt-tokens", "256", "--max-new-tokens", "4", "--dtype", "float32", "--presses", "",
        "--timing-rounds", "1", "--kvpress-python", sys.executable, "--out", str(out),
        "--cache", str(tmp_path / "cache"),
    ]  # fmt: skip
    assert table.main([*argv, "--minutes", "0"]) == 0  # past its deadline at once: the timings, no example
    names = list(json.loads(out.with_suffix(".methods.json").read_text()))
    assert {r["example"] for r in _rows(out)} == {table.SPEED} and len(_rows(out)) == len(names)
    assert out.with_suffix(".md").exists()  # the table of what there is
    assert not out.with_suffix(".png").exists()  # no example yet: nothing to draw
    assert table.main(argv) == 0
    rows = _rows(out)
    assert {"unpruned", "tuned pick", "paper-style", "gemfilter (published)", "tsp (published)", table.VENV_CONTROL} <= set(names)  # fmt: skip
    keys = [(r["method"], r["example"]) for r in rows]
    assert len(keys) == len(set(keys)) == 3 * len(names)  # two examples and one timing per row
    assert {r["dataset"] for r in rows if r["example"] != table.SPEED} == {"hotpotqa-long", "squad-long"}
    by = {(r["method"], r["example"]): r for r in rows}
    for r in rows:
        if r["example"] == table.SPEED:
            assert r["speed"]["speedup"] > 0 and r["speed"]["clock"] == "cpu"
            continue
        n = r["prompt_tokens"]
        unpruned = by[("unpruned", r["example"])]
        assert r["kv_bytes_unpruned"] == unpruned["kv_bytes"] == n * 4 * PER_TOKEN_LAYER
        assert 0 < r["context_tokens"] < n and r["baseline_score"] == unpruned["score"]
        if r["method"] == table.VENV_CONTROL:  # the worker's own unpruned route: every KV pair, no drift
            assert (r["kv_bytes"], r["kl"], r["top1"], r["flop_speedup"]) == (
                unpruned["kv_bytes"],
                0.0,
                1.0,
                1.0,
            )
        if r["method"] == "tuned pick":
            assert r["kv_bytes"] < r["kv_bytes_unpruned"] and r["kl"] >= 0 and r["flop_speedup"] > 1
    markdown = out.with_suffix(".md").read_text()
    assert markdown.count("\n| ") == len(names) + 1 and "| 2 |" in markdown
    assert out.with_suffix(".png").read_bytes().startswith(b"\x89PNG")  # the figure beside it

    before = out.read_bytes()
    assert table.main(argv) == 0  # nothing left: no row computed again, no worker started
    assert out.read_bytes() == before
    out.write_bytes(before[:-9])  # a run killed while writing its last row
    assert table.main(argv) == 0  # the truncated last row is cut off and computed again, alone
    again = _rows(out)
    assert [(r["method"], r["example"]) for r in again] == keys


def _row(method: str, example: str, score: float, side: str = "kvpress") -> dict[str, Any]:
    return {"method": method, "example": f"squad-long/{example}", "dataset": "squad-long", "record_id": example,
            "side": side, "prompt_tokens": 100, "score": score, "baseline_score": 1.0, "prediction": "x",
            "new_tokens": 1, "kl": 0.5 * score, "top1": 1.0, "kv_bytes": 50, "kv_bytes_unpruned": 100,
            "flop_speedup": 1.0}  # fmt: skip


def test_a_press_is_also_scored_against_its_own_venvs_unpruned_model() -> None:
    rows = [
        _row(table.VENV_CONTROL, "a", 1.0), _row(table.VENV_CONTROL, "b", 0.0),
        _row("press", "a", 0.0), _row("press", "b", 0.0), _row("press", "c", 1.0),
        _row("tuned pick", "a", 1.0, "lazyllm"), _row("tuned pick", "b", 0.0, "lazyllm"),
    ]  # fmt: skip
    control, press, ours = table.summarize(rows, [table.VENV_CONTROL, "press", "tuned pick"])
    assert (control["loss"].value, control["own_loss"].value) == (50.0, 0.0)
    assert press["n"] == 3 and press["loss"].value == pytest.approx(100 * 2 / 3)
    assert press["own_loss"].value == 50.0 and press["own_loss"].n == 2  # paired on the control's a and b
    assert ours["own_loss"] is ours["loss"] and ours["loss"].value == 50.0
    assert press["kl"] == pytest.approx(0.5 / 3) and press["kv_share"] == 0.5
    # against the pick, paired on a and b (c has no pick answer): the press loses a's point
    assert press["vs_pick"].value == 50.0 and press["vs_pick"].n == 2
    assert ours["vs_pick"].value == 0.0 and control["vs_pick"].value == 0.0
    assert table.markdown([press]).splitlines()[-1].split("|")[7].strip().startswith("50.00 [")


def test_the_figure_draws_each_timed_row_with_its_n(tmp_path: Path) -> None:
    rows = [
        _row("tuned pick", "a", 1.0, "lazyllm"),
        _row("tuned pick", "b", 0.0, "lazyllm"),
        _row("press", "a", 0.0),
    ]
    summary = table.summarize(rows, ["tuned pick", "press"])
    summary[0]["ttft_speedup"] = 1.5  # timed (the press is not)
    fig = table.figure(summary, "title")
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "tuned pick (n=2)" in labels and not any(t.startswith("press") for t in labels)  # press: not timed
    specs = [table.Spec("tuned pick", "lazyllm", "lazyllm"), table.Spec("press", "kvpress", "press")]
    table.write_table(specs, [], tmp_path / "t.md", "header; x\n\n")
    assert not (tmp_path / "t.png").exists()  # no rows: nothing drawn
