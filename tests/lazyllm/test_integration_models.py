"""Integration: the packaged SmolLM2 and Gemma 3 models through the real engine."""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import pytest
import torch

from lazyllm.engine import LazyLLM
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from tests.reference import reference_prefill
from tests.support import hf_greedy, longbench_dir

pytestmark = pytest.mark.integration


def real_text_ids(tokenizer: Any, n_tokens: int) -> torch.Tensor:
    """``[1, n_tokens]`` ids of a real LongBench context (the first multi_news record)."""
    path = os.path.join(longbench_dir(), "multi_news.jsonl")
    with open(path) as fh:
        text = json.loads(fh.readline())["context"]
    ids = tokenizer(text)["input_ids"][:n_tokens]
    assert len(ids) == n_tokens
    return torch.tensor([ids])


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_keep_all_equals_transformers(which: str, request: pytest.FixtureRequest) -> None:
    model, tokenizer = request.getfixturevalue(which)
    # Gemma 3 270M slides a 512 window: 700 tokens exercise its masks
    ids = real_text_ids(tokenizer, 700 if which == "gemma3" else 300)
    with torch.inference_mode():
        expected = model(ids).logits[:, -1].float()
    name = model.config.name_or_path
    result = LazyLLM(model, Schedule.keep_all(name, model.config.num_hidden_layers)).prefill(ids)
    torch.testing.assert_close(result.logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_pruned_subsets_and_counts(which: str, request: pytest.FixtureRequest) -> None:
    model, tokenizer = request.getfixturevalue(which)
    layers = model.config.num_hidden_layers
    ids = real_text_ids(tokenizer, 700)
    schedule = Schedule.progressive(
        model.config.name_or_path, layers, start_layer=2, final_keep=0.2, stages=4
    )
    result = LazyLLM(model, schedule).prefill(ids)
    positions = [p.tolist() for p in result.computed_positions]
    assert result.active_counts == schedule.keep_counts(700)
    assert result.active_counts[-1] < 0.25 * 700
    for a, b in itertools.pairwise(positions):
        assert set(b) <= set(a)
    assert all(p[-1] == 699 for p in positions)
    assert torch.isfinite(result.logits).all()


def test_smollm2_survivors_match_eager_reference(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    eager, _ = load_model("smollm2-135m", device="cpu", attn_implementation="eager")
    ids = real_text_ids(tokenizer, 200)
    schedule = Schedule.from_layers("smollm2-135m", 30, {3: 40, 10: 50, 20: 50})
    result = LazyLLM(model, schedule).prefill(ids)
    ref_logits, ref_positions, _ = reference_prefill(eager, ids[0].tolist(), list(schedule.percentiles))
    assert [p.tolist() for p in result.computed_positions] == ref_positions
    torch.testing.assert_close(result.logits[0], ref_logits, atol=1e-4, rtol=0)


def test_smollm2_keep_all_generation_equals_transformers(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    ids = real_text_ids(tokenizer, 400)
    engine = LazyLLM(model, Schedule.keep_all("smollm2-135m", 30), tokenizer=tokenizer)
    result = engine.generate(ids, max_new_tokens=64, eos_token_id=[], return_logits=True)
    out = hf_greedy(model, ids, 64)
    assert result.token_ids == out.sequences[0, 400:].tolist()
    worst = max(float((a - b[0].float()).abs().max()) for a, b in zip(result.step_logits, out.logits))
    assert worst < 1e-4


def test_smollm2_pruned_generation_computes_each_pair_once(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    ids = real_text_ids(tokenizer, 400)
    engine = LazyLLM(model, Schedule.paper_style("smollm2-135m", 30), tokenizer=tokenizer)
    result = engine.generate(ids, max_new_tokens=16, eos_token_id=[], trace=True)
    assert result.trace is not None
    assert int(result.trace.computed_counts(415).max()) == 1
    assert 0.7 < result.prompt_computed_fraction < 1.0
    assert result.prompt_computed_per_layer[:15] == [1.0] * 15
    assert result.prompt_computed_per_step == sorted(result.prompt_computed_per_step)
