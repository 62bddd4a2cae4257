from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from lazyllm.engine import LazyLLM
from lazyllm.flops import ModelDims
from lazyllm.methods import METHODS, check_options, make_method
from lazyllm.peers import (
    PEERS,
    GemFilter,
    GemFilterKnobs,
    TokenBudget,
    TokenSelectivePropagation,
    TSPKnobs,
    match_speedup,
    peer_flop_speedup,
)
from tests.support import ARCHS, hf_greedy, prompt

N = 24  # > the tiny models' sliding window of 8, so the masks matter
STEPS = 4
ModelPair = Callable[[str], tuple[Any, Any]]


def _unpruned(model: Any, ids: torch.Tensor) -> Any:
    """The unpruned model's greedy decoding (keep-all LazyLLM, equal to transformers' generate by
    tests/lazyllm/test_decode.py; ours never stops at a token, which transformers' EOS handling would)."""
    return make_method("baseline", model, None).generate(
        ids, max_new_tokens=STEPS, eos_token_id=[], return_logits=True
    )


def _assert_same_greedy(result: Any, reference: Any) -> None:
    """Tokens equal and every step's logits within 1e-4."""
    assert len(result.token_ids) == STEPS
    assert result.token_ids == reference.token_ids
    for ours, theirs in zip(result.step_logits, reference.step_logits, strict=True):
        assert torch.allclose(ours, theirs, atol=1e-4), float((ours - theirs).abs().max())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", [1.0, float(N)])  # every token, as a fraction and as a count
def test_gemfilter_keeping_everything_is_the_unpruned_model(
    model_pair: ModelPair, arch: str, k: float
) -> None:
    model, _ = model_pair(arch)
    ids = prompt(N, seed=11)
    gem = GemFilter(model, r=2, k=k)
    result = gem.generate(ids, max_new_tokens=STEPS, eos_token_id=[], return_logits=True)
    assert gem.select(ids).kept.tolist() == list(range(N))
    assert result.prompt_tokens == N
    # and transformers itself gives the first step's logits (no EOS involved yet)
    hf = hf_greedy(model, ids, 1)
    assert torch.allclose(result.step_logits[0], hf.logits[0][0].float(), atol=1e-4)
    _assert_same_greedy(result, _unpruned(model, ids))


@pytest.mark.parametrize("arch", ARCHS)
def test_tsp_full_budget_is_keep_all(model_pair: ModelPair, arch: str) -> None:
    model, _ = model_pair(arch)
    ids = prompt(N, seed=12)
    tsp = TokenSelectivePropagation(model, layer=1, budget=1.0)
    assert not tsp.schedule(N).prunes
    result = tsp.generate(ids, max_new_tokens=STEPS, eos_token_id=[], return_logits=True)
    _assert_same_greedy(result, _unpruned(model, ids))


@pytest.mark.parametrize("arch", ARCHS)
def test_gemfilter_lasttoken_keeps_the_top_k_by_layer_r_attention(model_pair: ModelPair, arch: str) -> None:
    """The last-token variant keeps the top k by the last query's layer-r attention (mean over heads)
    of an eager forward of transformers itself, in order, and the second pass is the plain model on them."""
    model, eager = model_pair(arch)
    ids = prompt(N, seed=13)
    r, k = 3, 7
    gem = make_method("gemfilter-lasttoken", model, None, options={"r": r, "k": k})
    assert isinstance(gem, GemFilter) and str(gem.scoring) == "w1-softmax-none-mean"
    selection = gem.select(ids)
    with torch.inference_mode():
        attn = eager(ids, output_attentions=True).attentions[r - 1]  # [1, H, N, N]
    expected_scores = attn[0, :, -1, :].mean(dim=0).float()  # [N]
    assert torch.allclose(selection.scores, expected_scores, atol=1e-5)
    ranked = sorted(range(N - 1), key=lambda i: (float(expected_scores[i]), i))  # the last query always stays
    dropped = set(ranked[: N - k])
    assert selection.kept.tolist() == [i for i in range(N) if i not in dropped]
    assert selection.filter_counts == (N,) * r + (1,) * (model.config.num_hidden_layers - r)
    result = gem.generate(ids, max_new_tokens=STEPS, eos_token_id=[], return_logits=True)
    kept_ids = ids[:, selection.kept]  # positions 0..k-1 in the second pass
    _assert_same_greedy(result, _unpruned(model, kept_ids))


def test_gemfilter_counts_and_timing(model_pair: ModelPair) -> None:
    model, _ = model_pair("llama")
    ids = prompt(30, seed=3)
    layers = model.config.num_hidden_layers
    gem = GemFilter(model, r=2, k=0.3)  # 30 - floor(0.7 * 30) = 9 tokens
    assert gem.select(ids).kept.shape[0] == 9 and int(gem.select(ids).kept[-1]) == 29
    result = gem.generate(ids, max_new_tokens=3, eos_token_id=[])
    # filter pass: 30 tokens in layers 0-1, the last one after; second pass: 9 tokens everywhere
    assert result.prompt_computed_per_layer == pytest.approx([39 / 30] * 2 + [10 / 30] * (layers - 2))
    assert result.prompt_tokens == 30 and result.ttft_s > 0 and result.total_s >= result.ttft_s


def test_tsp_propagates_the_budget_and_never_revives(model_pair: ModelPair) -> None:
    model, _ = model_pair("qwen2")
    ids = prompt(40, seed=5)
    layers = model.config.num_hidden_layers
    tsp = TokenSelectivePropagation(model, layer=1, budget=10)
    assert tsp.schedule(40).keep_counts(40) == [40, 40] + [10] * (layers - 2)
    result = tsp.generate(ids, max_new_tokens=6, eos_token_id=[])
    # layers 0-1 computed every prompt token, later layers the 10 propagated ones, and no decoding
    # step brought another prompt token back
    assert result.prompt_computed_per_layer == pytest.approx([1.0, 1.0] + [0.25] * (layers - 2))
    assert len(set(result.prompt_computed_per_step)) == 1


def test_knob_defaults_follow_the_papers_scaled_to_depth() -> None:
    # the papers' own models (32 layers): GemFilter's 13th layer, FastKV's TSP layer 15, 20% budgets
    assert GemFilterKnobs().resolve(32) == (13, TokenBudget(0.2))
    assert TSPKnobs().resolve(32) == (15, TokenBudget(0.2))
    assert GemFilterKnobs().resolve(30)[0] == 12 and TSPKnobs().resolve(30)[0] == 14  # SmolLM2
    assert GemFilterKnobs().resolve(2)[0] == 1 and TSPKnobs().resolve(2)[0] == 0


def test_options_are_validated_strictly(model_pair: ModelPair) -> None:
    with pytest.raises(ValueError, match=r"Unknown option\(s\) 'x' for method 'gemfilter'. Valid: k, r"):
        check_options("gemfilter", {"x": 1.0})
    with pytest.raises(ValueError, match="Valid: budget, layer"):
        check_options("tsp", {"k": 0.5})
    with pytest.raises(ValueError, match="whole number"):
        check_options("gemfilter", {"r": 2.5})
    with pytest.raises(ValueError, match="token count"):
        check_options("tsp", {"budget": 0.0})
    with pytest.raises(ValueError, match="whole number"):
        check_options("tsp", {"budget": 12.5})
    with pytest.raises(ValueError, match="takes no options"):
        check_options("random", {"k": 0.5})
    with pytest.raises(ValueError, match="Unknown method"):
        check_options("gemfilterx", {})
    check_options("gemfilter", {"r": 3, "k": 0.5})
    model, _ = model_pair("llama")  # 5 layers
    with pytest.raises(ValueError, match=r"must be in 1\.\.4"):
        make_method("gemfilter", model, None, options={"r": 5})
    with pytest.raises(ValueError, match=r"must be in 0\.\.3"):
        make_method("tsp", model, None, options={"layer": 4})
    gem = make_method("gemfilter", model, None, options={"r": 3, "k": 5})
    assert isinstance(gem, GemFilter) and gem.r == 3 and gem.k.count(40) == 5
    tsp = make_method("tsp", model, None, options={"budget": 0.5})
    assert isinstance(tsp, TokenSelectivePropagation) and tsp.layer == 2 and tsp.budget.count(40) == 20


def _dims(layers: int = 30) -> ModelDims:
    return ModelDims(
        hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64, vocab=49152, windows=(None,) * layers
    )


def test_flop_speedups() -> None:
    dims, n = _dims(), 1000
    assert peer_flop_speedup("tsp", dims, n, {"budget": 1.0}) == 1.0
    # keeping everything, GemFilter pays its filter pass (12 of 30 layers) on top of a full prefill
    assert (
        1 / (1 + 13 / 30) < peer_flop_speedup("gemfilter", dims, n, {"k": 1.0, "r": 12}) < 1 / (1 + 11 / 30)
    )
    for method, knob in (("gemfilter", "k"), ("tsp", "budget")):
        speedups = [peer_flop_speedup(method, dims, n, {knob: f}) for f in (1.0, 0.5, 0.2, 0.05)]
        assert speedups == sorted(speedups)  # fewer tokens, faster
    # linear parts dominate at short prompts: TSP at layer 14 of 30 keeping 20% is close to 30 / (15 + 0.2 * 15)
    assert peer_flop_speedup("tsp", dims, 64, {"budget": 0.2}) == pytest.approx(30 / 18, rel=0.02)


@pytest.mark.parametrize("method", ["gemfilter", "tsp"])
def test_match_speedup_keeps_the_most_tokens_that_reach_the_target(method: str) -> None:
    dims, n, target = _dims(), 1000, 1.5
    knob = {"gemfilter": "k", "tsp": "budget"}[method]
    options = match_speedup(method, dims, n, target)
    assert options is not None and set(options) == {knob}
    assert peer_flop_speedup(method, dims, n, options) >= target
    one_more = {knob: options[knob] + 1 / n}
    assert peer_flop_speedup(method, dims, n, one_more) < target
    assert match_speedup(method, dims, n, 50.0) is None  # beyond what the filter/full layers allow
    with pytest.raises(ValueError, match="Valid"):
        match_speedup(method, dims, n, 1.5, {"nope": 1.0})


@pytest.mark.integration
def test_peers_exact_on_smollm2(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    text = (
        "The capital of France is Paris. The capital of Italy is Rome. " * 8 + "What is the capital of Italy?"
    )
    base = make_method("baseline", model, tokenizer)
    ref = base.generate(text, chat=True, max_new_tokens=6, eos_token_id=[], return_logits=True)
    for method, options in (("gemfilter", {"k": 1.0}), ("tsp", {"budget": 1.0})):
        out = make_method(method, model, tokenizer, options=options).generate(
            text, chat=True, max_new_tokens=6, eos_token_id=[], return_logits=True
        )
        assert out.token_ids == ref.token_ids, method
        for a, b in zip(out.step_logits, ref.step_logits, strict=True):
            assert torch.allclose(a, b, atol=1e-4), (method, float((a - b).abs().max()))
    gem = make_method("gemfilter", model, tokenizer)  # paper defaults: r = 12 of 30, 20% kept
    assert isinstance(gem, GemFilter) and gem.r == 12
    out = gem.generate(text, chat=True, max_new_tokens=6)
    assert out.prompt_computed_per_layer[0] > 1.0 > out.prompt_computed_per_layer[-1]


# --------------------------------------------------------------------------------------------------
# the published rules, recomputed by hand
def _kept_by(scores: torch.Tensor, keep: int) -> list[int]:
    """Positions kept: the last always, then the top ``keep - 1`` of the others (ties: earlier dropped)."""
    n = scores.shape[0]
    ranked = sorted(range(n - 1), key=lambda i: (float(scores[i]), i))
    dropped = set(ranked[: n - keep])
    return [i for i in range(n) if i not in dropped]


def test_gemfilter_selects_by_raw_qk_summed_over_heads_avg_pooled(model_pair: ModelPair) -> None:
    """GemFilter's rule (arXiv 2409.17422) from the llama layer's own projections: the last query's
    q.k / sqrt(D) after rotary embedding, summed over heads, average-pooled with kernel 5."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model, _ = model_pair("llama")
    ids = prompt(N, seed=21)
    r, k = 3, 9
    gem = make_method("gemfilter", model, None, options={"r": r, "k": k})
    assert isinstance(gem, GemFilter) and str(gem.scoring) == "w1-raw-avg5-sum"
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    dim = cfg.hidden_size // heads
    with torch.inference_mode():
        hidden = model(ids, output_hidden_states=True).hidden_states[r - 1]  # input of layer r (1-based)
        layer = model.model.layers[r - 1]
        x = layer.input_layernorm(hidden)
        q = layer.self_attn.q_proj(x).view(1, N, heads, dim).transpose(1, 2)
        key = layer.self_attn.k_proj(x).view(1, N, kv_heads, dim).transpose(1, 2)
        cos, sin = model.model.rotary_emb(hidden, torch.arange(N)[None])
        q, key = apply_rotary_pos_emb(q, key, cos, sin)
        key = key.repeat_interleave(heads // kv_heads, dim=1)  # [1, H, N, D]
        logits = (q[0, :, -1:] @ key[0].transpose(-1, -2))[:, 0] / dim**0.5  # [H, N], pre-softmax
        summed = logits.sum(dim=0)
        pooled = torch.nn.functional.avg_pool1d(summed[None, None], 5, stride=1, padding=2)[0, 0]
    selection = gem.select(ids)
    torch.testing.assert_close(selection.scores, pooled, atol=1e-4, rtol=1e-5)
    assert selection.kept.tolist() == _kept_by(pooled, k)
    # the last-token variant chooses differently here (so the test tells the rules apart)
    old = make_method("gemfilter-lasttoken", model, None, options={"r": r, "k": k})
    assert isinstance(old, GemFilter) and old.select(ids).kept.tolist() != selection.kept.tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_tsp_selects_by_fastkv_window_attention(model_pair: ModelPair, arch: str) -> None:
    """FastKV's rule (arXiv 2502.01068) from transformers' eager attention at the TSP layer: the last 8
    queries' softmax rows summed, max-pooled with kernel 7 per head, summed over heads."""
    model, eager = model_pair(arch)
    ids = prompt(N, seed=22)
    layer, budget = 1, 10
    tsp = make_method("tsp", model, None, options={"layer": layer, "budget": budget})
    assert isinstance(tsp, TokenSelectivePropagation) and str(tsp.scoring) == "w8-softmax-max7-sum"
    with torch.inference_mode():
        attn = eager(ids, output_attentions=True).attentions[layer][0].float()  # [H, N, N]
    window = attn[:, -8:, :].sum(dim=1)  # [H, N]
    pooled = torch.nn.functional.max_pool1d(window[:, None], 7, stride=1, padding=3)[:, 0]
    scores = pooled.sum(dim=0)
    prefill = LazyLLM(model, tsp.schedule(N), strict_model_name=False).prefill(ids, return_scores=True)
    torch.testing.assert_close(prefill.scores[layer], scores, atol=1e-5, rtol=1e-4)
    assert prefill.computed_positions[layer + 1].tolist() == _kept_by(scores, budget)


def test_each_peer_names_its_rule_and_source() -> None:
    assert set(PEERS) == {"gemfilter", "gemfilter-lasttoken", "tsp", "tsp-lasttoken"}
    assert (
        "arXiv 2409.17422" in PEERS["gemfilter"].describe()
        and "w1-raw-avg5-sum" in PEERS["gemfilter"].describe()
    )
    assert "arXiv 2502.01068" in PEERS["tsp"].describe() and "w8-softmax-max7-sum" in PEERS["tsp"].describe()
    for name in ("gemfilter-lasttoken", "tsp-lasttoken"):
        assert str(PEERS[name].rule) == "w1-softmax-none-mean" and not PEERS[name].published
    assert METHODS["tsp"].size_knob == "budget" and METHODS["gemfilter"].size_knob == "k"
    assert METHODS["lazyllm"].size_knob is None
    # FastKV's window costs 8 query rows at the TSP layer: a little slower than the last-token variant
    dims = _dims()
    fast, last = (PEERS[m].flop_speedup(dims, 1000, {"budget": 0.2}) for m in ("tsp", "tsp-lasttoken"))
    assert last > fast > 0.99 * last
