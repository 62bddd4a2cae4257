"""Scoring rules (lazyllm/scoring.py, lazyllm/importance.py) and the selectors that rank by them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lazyllm.engine import LazyLLM
from lazyllm.importance import last_query_attention, window_scores
from lazyllm.schedule import Revival, Schedule
from lazyllm.scoring import Scoring
from lazyllm.selectors import ScoringSelector
from tests.support import ARCHS, prompt

ModelPair = Callable[[str], tuple[Any, Any]]


# --------------------------------------------------------------------------------------------------
# the default rule is today's, bit for bit
@settings(max_examples=60, deadline=None)
@given(
    kv_heads=st.integers(1, 4),
    groups=st.integers(1, 4),
    k=st.integers(2, 300),
    masked=st.booleans(),
    softcap=st.sampled_from([None, 20.0]),
    reorder=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_default_rule_equals_last_query_attention_bit_for_bit(
    kv_heads: int, groups: int, k: int, masked: bool, softcap: float | None, reorder: bool, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    heads, dim = kv_heads * groups, 8
    query = torch.randn(1, heads, 3, dim, generator=g) * 3
    key = torch.randn(1, kv_heads, k, dim, generator=g) * 3
    mask = torch.rand(k, generator=g) > 0.3 if masked else None
    if mask is not None:
        mask[-1] = True
    order = torch.randperm(k, generator=g) if reorder else None  # a decoding step reads keys back
    today = last_query_attention(query, key, 0.35, mask, softcap)[0]
    today = today if order is None else today[order]
    per_head = window_scores(query[:, :, -1:], key, 0.35, None if mask is None else mask[None], softcap)
    ours = Scoring().token_scores(per_head, order)
    assert torch.equal(ours, today)


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_default_rule_selects_as_the_eager_last_query_attention(
    model_pair: ModelPair, arch: str
) -> None:
    """Scores of the default rule (a v2 file's meaning) are the eager model's last-row attention, mean over
    heads, and the survivors are its top tokens."""
    model, eager = model_pair(arch)
    ids = prompt(20, seed=4)
    layers = model.config.num_hidden_layers
    zeros = ", 0" * (layers - 2)
    v2 = Schedule.from_json(
        f'{{"format": "lazyllm-schedule", "version": 2, "model": "m", "num_layers": {layers}, '
        f'"percentiles": [0, 50{zeros}], "revival": {{"policy": "dynamic"}}}}'
    )
    assert v2.scoring == Scoring()
    result = LazyLLM(model, v2, strict_model_name=False).prefill(ids, return_scores=True)
    with torch.inference_mode():
        attn = eager(ids, output_attentions=True).attentions[1]  # [1, H, N, N]
    expected = attn[0, :, -1].mean(dim=0).float()
    torch.testing.assert_close(result.scores[1], expected, atol=1e-5, rtol=1e-4)
    kept = result.computed_positions[2].tolist()
    ranked = sorted(range(19), key=lambda i: (float(result.scores[1][i]), i))
    assert kept == sorted(set(range(20)) - set(ranked[:10]))


# --------------------------------------------------------------------------------------------------
# each rule by hand
def test_pooling_by_hand() -> None:
    x = torch.tensor([[0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])  # one head, n = 10
    mx = Scoring.parse("w1-softmax-max7-sum").token_scores(x)
    # max over positions i-3..i+3 (padding ignored): the 5 at index 2 reaches 0..5, the 1 at 9 reaches 6..9
    assert mx.tolist() == [5, 5, 5, 5, 5, 5, 1, 1, 1, 1]
    av = Scoring.parse("w1-softmax-avg5-sum").token_scores(x)
    # mean over i-2..i+2 with zero padding counted (/5 everywhere)
    assert av.tolist() == pytest.approx([1, 1, 1, 1, 1, 0, 0, 0.2, 0.2, 0.2])
    two = torch.tensor([[1.0, 4.0, 2.0], [3.0, 0.0, 5.0]])  # two heads
    assert Scoring(heads="sum").token_scores(two).tolist() == [4, 4, 7]
    assert Scoring(heads="mean").token_scores(two).tolist() == [2, 2, 3.5]
    assert Scoring(heads="max").token_scores(two).tolist() == [3, 4, 5]
    # pooling comes before the head reduction (FastKV pools each head): max-pool-3 then sum
    assert Scoring.parse("w1-softmax-max3-sum").token_scores(two).tolist() == [4 + 3, 4 + 5, 4 + 5]
    # an order (a decoding step's key order) is applied before pooling
    order = torch.tensor([2, 0, 1])
    assert Scoring.parse("w1-softmax-max3-sum").token_scores(two, order).tolist() == [2 + 5, 4 + 5, 4 + 3]


def _logit_keys(logits: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Query ``[1, H, 1, 1]`` of ones and keys ``[1, H, K, 1]`` equal to the wanted logits (scaling 1)."""
    keys = torch.tensor(logits)[None, :, :, None]
    return torch.ones(1, len(logits), 1, 1), keys


def test_raw_logits_and_softmax_rank_differently() -> None:
    # head 0 prefers token 1 enormously; heads 1-3 prefer token 0 mildly
    query, key = _logit_keys([[0.0, 20.0, -30.0], [2.0, 0.0, -30.0], [2.0, 0.0, -30.0], [2.0, 0.0, -30.0]])
    soft = Scoring(heads="sum").token_scores(window_scores(query, key, 1.0, None, None, "softmax"))
    raw = Scoring(values="raw", heads="sum").token_scores(window_scores(query, key, 1.0, None, None, "raw"))
    assert raw.tolist() == [6.0, 20.0, -120.0]  # q.k summed over heads
    assert float(soft[0]) > float(soft[1])  # softmax saturates head 0: 3 x 0.88 beats 1.0
    assert float(raw[1]) > float(raw[0])


def test_window_sums_causal_softmax_rows() -> None:
    """w = 2: the two newest queries (positions 1 and 2 of 3 keys); position 1 cannot see key 2."""
    key = torch.tensor([[[1.0], [2.0], [3.0]]])[None]  # [1, 1, 3, 1]
    queries = torch.tensor([[[[1.0], [1.0]]]])  # [1, 1, 2, 1]
    allowed = torch.tensor([[True, True, False], [True, True, True]])
    got = window_scores(queries, key, 1.0, allowed, None, "softmax")
    row1 = torch.softmax(torch.tensor([1.0, 2.0]), 0)
    row2 = torch.softmax(torch.tensor([1.0, 2.0, 3.0]), 0)
    torch.testing.assert_close(got[0], torch.cat([row1, torch.zeros(1)]) + row2)
    raw = window_scores(queries, key, 1.0, allowed, None, "raw")
    assert raw[0, 0] == 2.0 and raw[0, 1] == 4.0 and raw[0, 2] < -1e8  # key 2 unseen by one query


def test_stage_rule_averages_the_layers_since_the_previous_stage() -> None:
    rule = Scoring.parse("w1-softmax-none-mean-stage")
    selector = ScoringSelector(rule, (0.0, 50.0, 0.0, 30.0, 0.0, 0.0)).begin()
    assert [selector.observes(i) for i in range(6)] == [True, True, True, True, False, False]
    pos = torch.arange(3)
    for layer, scores in enumerate(([1.0, 0.0, 0.0], [3.0, 0.0, 0.0])):
        selector.observe(layer, torch.tensor(scores), pos)
    assert selector.rank(1, torch.tensor([3.0, 0.0, 0.0]), pos).tolist() == [2.0, 0.0, 0.0]
    # the next stage starts afresh at layer 2 (layers 2 and 3)
    selector.observe(2, torch.tensor([0.0, 4.0]), pos[:2])
    selector.observe(3, torch.tensor([0.0, 2.0]), pos[:2])
    assert selector.rank(3, torch.tensor([0.0, 2.0]), pos[:2]).tolist() == [0.0, 3.0]


# --------------------------------------------------------------------------------------------------
# the engine with a window rule, prefill and decoding, against eager attention
@pytest.mark.parametrize("arch", ARCHS)
def test_window_rule_in_prefill_and_decoding_matches_eager_attention(
    model_pair: ModelPair, arch: str
) -> None:
    """``w2-softmax-max3-sum`` at layer 1 (nothing pruned before it, so layer 1 sees the unpruned model's
    states): the prefill ranks by the last 2 prompt queries and the first decoding step (dynamic
    re-selection) by the last prompt query and the new token, each pooled per head and summed."""
    model, eager = model_pair(arch)
    n, layers = 20, model.config.num_hidden_layers
    rule = Scoring.parse("w2-softmax-max3-sum")
    schedule = Schedule.from_layers("m", layers, {1: 50}).with_scoring(rule).with_revival(Revival("dynamic"))
    ids = prompt(n, seed=9)
    result = LazyLLM(model, schedule, strict_model_name=False).generate(
        ids, max_new_tokens=2, eos_token_id=[], trace=True
    )
    assert result.trace is not None and result.scoring == "w2-softmax-max3-sum"
    full = torch.cat([ids, torch.tensor([[result.token_ids[0]]])], dim=1)
    with torch.inference_mode():
        attn = eager(full, output_attentions=True).attentions[1][0].float()  # [H, N+1, N+1]

    def by_hand(rows: torch.Tensor) -> torch.Tensor:  # rows: [H, 2, K] -> [K]
        window = rows.sum(dim=1)
        return F.max_pool1d(window[:, None], 3, stride=1, padding=1)[:, 0].sum(dim=0)

    prefill = result.trace.passes[0].scores[1]
    torch.testing.assert_close(prefill, by_hand(attn[:, n - 2 : n, :n]), atol=1e-5, rtol=1e-4)
    step = result.trace.passes[1].scores[1]
    torch.testing.assert_close(step, by_hand(attn[:, n - 1 : n + 1, : n + 1]), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("rule", ["fastkv", "gemfilter", "w4-raw-none-max-stage"])
def test_keep_all_is_exact_whatever_the_rule(model_pair: ModelPair, rule: str) -> None:
    model, _ = model_pair("qwen2")
    ids = prompt(24, seed=2)
    keep_all = Schedule.keep_all("m", model.config.num_hidden_layers)
    ref = LazyLLM(model, keep_all, strict_model_name=False).generate(
        ids, max_new_tokens=3, eos_token_id=[], return_logits=True
    )
    out = LazyLLM(model, keep_all.with_scoring(rule), strict_model_name=False).generate(
        ids, max_new_tokens=3, eos_token_id=[], return_logits=True
    )
    assert out.token_ids == ref.token_ids
    assert all(torch.equal(a, b) for a, b in zip(out.step_logits, ref.step_logits, strict=True))
