from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel

from lazyllm.attention import causal_mask
from lazyllm.engine import LazyLLM, select_survivors
from lazyllm.schedule import Schedule
from tests.reference import reference_prefill
from tests.support import ARCHS, make_tiny, prompt


def state_digest(model: Any) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_keep_all_equals_transformers(
    arch: str, attn: str, model_pair: Callable[[str], tuple[Any, Any]]
) -> None:
    model = model_pair(arch)[0 if attn == "sdpa" else 1]
    ids = prompt(40)  # longer than the sliding window of 8
    with torch.inference_mode():
        expected = model(ids).logits[:, -1].float()
    result = LazyLLM(
        model, Schedule.keep_all(model.config.name_or_path, model.config.num_hidden_layers)
    ).prefill(ids)
    assert result.logits.shape == expected.shape
    torch.testing.assert_close(result.logits, expected, atol=1e-4, rtol=0)
    assert result.active_counts == [40] * model.config.num_hidden_layers
    assert result.prompt_computed_fraction == 1.0


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_pruned_prefill_matches_slow_reference(
    arch: str, data: st.DataObject, model_pair: Callable[[str], tuple[Any, Any]]
) -> None:
    sdpa, eager = model_pair(arch)
    layers = sdpa.config.num_hidden_layers
    n = data.draw(st.integers(1, 48), label="n")
    pct = data.draw(
        st.lists(
            st.sampled_from([0.0, 0.0, 10.0, 25.0, 50.0, 75.0, 90.0]),
            min_size=layers - 1,
            max_size=layers - 1,
        ),
        label="percentiles",
    )
    schedule = Schedule(sdpa.config.name_or_path, (*pct, 0.0))
    ids = prompt(n, seed=data.draw(st.integers(0, 1000), label="seed"))
    result = LazyLLM(sdpa, schedule).prefill(ids, return_scores=True)
    ref_logits, ref_positions, ref_scores = reference_prefill(
        eager, ids[0].tolist(), list(schedule.percentiles)
    )

    got = [p.tolist() for p in result.computed_positions]
    assert got == ref_positions
    # subset property, last position always active, counts exactly by the rounding rule
    for a, b in itertools.pairwise(got):
        assert set(b) <= set(a) and b == sorted(b)
    assert all(p[-1] == n - 1 for p in got)
    assert result.active_counts == schedule.keep_counts(n)
    # importance equals the eager attention probabilities of the last query
    assert set(result.scores) == set(ref_scores)
    for layer, scores in result.scores.items():
        torch.testing.assert_close(scores, torch.tensor(ref_scores[layer]), atol=1e-5, rtol=1e-4)
        assert float(scores.sum()) == pytest.approx(1.0, abs=1e-4)
    torch.testing.assert_close(result.logits[0], ref_logits, atol=1e-4, rtol=0)


def test_survivors_are_the_top_scorers(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    sdpa, _ = model_pair("llama")
    schedule = Schedule.from_layers("tiny-llama", 5, {1: 60})
    result = LazyLLM(sdpa, schedule).prefill(prompt(30), return_scores=True)
    scores = result.scores[1]
    survivors = set(result.computed_positions[2].tolist())
    assert len(survivors) == 30 - 18
    pruned = set(range(29)) - survivors
    assert max(float(scores[i]) for i in pruned) <= min(float(scores[i]) for i in survivors - {29})


@pytest.mark.parametrize("arch", ARCHS)
def test_model_is_never_modified(arch: str) -> None:
    model = make_tiny(arch)
    ids = prompt(20)
    before = state_digest(model)
    with torch.inference_mode():
        expected = model(ids).logits
    engine = LazyLLM(
        model, Schedule.from_layers(model.config.name_or_path, model.config.num_hidden_layers, {0: 50})
    )
    engine.prefill(ids)
    with pytest.raises(ValueError):
        engine.prefill(torch.zeros(2, 5, dtype=torch.long))
    # an exception raised inside a layer still restores the model
    handle = model.model.layers[1].register_forward_hook(
        lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))
    )
    with pytest.raises(RuntimeError, match="boom"):
        engine.prefill(ids)
    handle.remove()
    assert model.config._attn_implementation == "sdpa"
    assert state_digest(model) == before
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, expected, atol=0, rtol=0)


def test_bad_inputs() -> None:
    model = make_tiny("llama")
    with pytest.raises(ValueError, match="5 layers"):
        LazyLLM(model, Schedule.keep_all("tiny-llama", 30))
    with pytest.raises(ValueError, match="not 'tiny-llama'"):
        LazyLLM(model, Schedule.keep_all("other", 5))
    LazyLLM(model, Schedule.keep_all("other", 5), strict_model_name=False)
    engine = LazyLLM(model, Schedule.keep_all("tiny-llama", 5))
    with pytest.raises(ValueError, match="one sequence at a time"):
        engine.prefill(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        engine.prefill(torch.zeros(1, 0, dtype=torch.long))
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match=r"model type 'gpt2' is not supported.*llama"):
        LazyLLM(gpt2, Schedule.keep_all("gpt2", 2), strict_model_name=False)


def test_select_survivors_rule() -> None:
    scores = torch.tensor([0.3, 0.1, 0.1, 0.5, 0.0])  # last entry is the last position: never ranked
    assert select_survivors(scores, 2).tolist() == [0, 3, 4]  # ties: the earlier position goes first
    assert select_survivors(scores, 0).tolist() == [0, 1, 2, 3, 4]
    assert select_survivors(scores, 4).tolist() == [4]
    with pytest.raises(ValueError):
        select_survivors(scores, 5)


def test_causal_mask_by_original_positions() -> None:
    pos = torch.tensor([0, 2, 5, 9])
    assert causal_mask(pos, None, torch.float32, explicit=False) is None
    assert causal_mask(pos, 10, torch.float32, explicit=False) is None  # window covers every pair
    m = causal_mask(pos, 4, torch.float32, explicit=False)
    assert m is not None and m.shape == (1, 1, 4, 4)
    allowed = (m[0, 0] == 0).int().tolist()
    assert allowed == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 1]]  # 5-2<4 yes; 9-5<4 no
    full = causal_mask(pos, None, torch.float32, explicit=True)
    assert full is not None and (full[0, 0] == 0).int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],
    ]
