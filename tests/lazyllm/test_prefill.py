"""lazyllm.prefill: several prompts' pruned prefills as one padded batch give each row what its lone
prefill gives (the same tokens kept at every layer, the same logits up to float rounding)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lazyllm import LazyLLM, Schedule
from lazyllm.prefill import RowPrefill, prefill_row, prefill_rows, prefills_together
from lazyllm.scoring import Scoring
from lazyllm.selectors import MeanAttentionSelector, RandomSelector
from tests.support import make_tiny, prompt

LENGTHS = (9, 31, 17, 24)  # past the sliding windows (8) of mistral, qwen2 and gemma3


def _percentiles(layers: int) -> tuple[float, ...]:
    p = [0.0] * layers
    p[1], p[3] = 40.0, 55.0
    return tuple(p)


def _assert_same(batched: RowPrefill, alone: RowPrefill) -> None:
    assert batched.n == alone.n and batched.gen.prompt_pairs == alone.gen.prompt_pairs
    for (k, v, pos), (k1, v1, pos1) in zip(batched.cache, alone.cache):
        assert torch.equal(pos, pos1)  # the same tokens computed at every layer, in the same slots
        torch.testing.assert_close(k, k1, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(v, v1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(batched.logits, alone.logits, rtol=1e-4, atol=1e-4)
    assert torch.equal(batched.gen.state.slot_of, alone.gen.state.slot_of)


@pytest.mark.parametrize("rule", ["last", "gemfilter", "w1-softmax-none-max-stage"])
def test_a_batch_of_prompts_prunes_each_row_as_its_lone_prefill(tiny: Any, rule: str) -> None:
    layers = tiny.config.num_hidden_layers
    schedule = Schedule(
        tiny.config.name_or_path, _percentiles(layers), scoring=Scoring.parse(rule)
    ).with_revival("frozen")
    engine = LazyLLM(tiny, schedule)
    assert prefills_together(engine)
    prompts = [prompt(n, seed=n) for n in LENGTHS]
    calls: list[int] = []
    handle = tiny.model.layers[0].register_forward_hook(lambda _m, args, _o: calls.append(args[0].shape[0]))
    try:
        batched = prefill_rows(engine, prompts)
    finally:
        handle.remove()
    assert calls == [len(prompts)]  # one pass of the whole batch, not one per prompt
    for got, ids in zip(batched, prompts):
        _assert_same(got, prefill_row(engine, ids))
    calls.clear()
    handle = tiny.model.layers[0].register_forward_hook(lambda _m, args, _o: calls.append(args[0].shape[0]))
    try:
        capped = prefill_rows(engine, prompts, max_tokens=60)  # lengths 9, 17 | 24 | 31
    finally:
        handle.remove()
    assert calls == [2, 1, 1]
    for got, ids in zip(capped, prompts):
        _assert_same(got, prefill_row(engine, ids))
    pruned = [got.computed for got in batched]
    assert all(c < 1.0 for c in pruned) and len(set(pruned)) > 1  # rows of different lengths, pruned


def test_baseline_selectors_and_captured_prefixes_batch_too() -> None:
    model = make_tiny("gemma3")
    name, layers = model.config.name_or_path, model.config.num_hidden_layers
    schedule = Schedule(name, _percentiles(layers)).with_revival("frozen")
    prompts = [prompt(n, seed=n) for n in LENGTHS]
    for selector in (RandomSelector(3), MeanAttentionSelector(2)):
        late = Schedule(name, (0.0, 50.0) + (0.0,) * (layers - 2)).with_revival("frozen")
        engine = LazyLLM(
            model, late if isinstance(selector, MeanAttentionSelector) else schedule, selector=selector
        )
        for got, ids in zip(prefill_rows(engine, prompts), prompts):
            _assert_same(got, prefill_row(engine, ids))
    keep_all = LazyLLM(model, Schedule.keep_all(name, layers))
    engine = LazyLLM(model, schedule)
    prefixes = [keep_all.capture_prefix(ids) for ids in prompts]
    for got, ids, prefix in zip(prefill_rows(engine, prompts, prefixes=prefixes), prompts, prefixes):
        _assert_same(got, prefill_row(engine, ids, prefix=prefix))


def test_schedules_that_revive_or_window_several_queries_prefill_alone() -> None:
    model = make_tiny("llama")
    name, layers = model.config.name_or_path, model.config.num_hidden_layers
    dynamic = LazyLLM(model, Schedule(name, _percentiles(layers)))
    windowed = LazyLLM(
        model, Schedule(name, _percentiles(layers), scoring=Scoring.parse("fastkv")).with_revival("frozen")
    )
    prompts = [prompt(n, seed=n) for n in LENGTHS]
    for engine in (dynamic, windowed):
        assert not prefills_together(engine)
        for got, ids in zip(prefill_rows(engine, prompts), prompts):
            alone = prefill_row(engine, ids)
            assert torch.equal(got.logits, alone.logits)  # the same lone passes, bit for bit
