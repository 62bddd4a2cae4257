from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from lazyllm.engine import LazyLLM
from lazyllm.schedule import Schedule
from lazyllm.selectors import RandomSelector
from tests.reference import reference_generate
from tests.support import ARCHS, hf_greedy, prompt


@pytest.mark.parametrize("arch", ARCHS)
def test_keep_all_decoding_equals_transformers_generate(
    arch: str, model_pair: Callable[[str], tuple[Any, Any]]
) -> None:
    model, _ = model_pair(arch)
    ids = prompt(30, seed=3)
    engine = LazyLLM(model, Schedule.keep_all(model.config.name_or_path, model.config.num_hidden_layers))
    result = engine.generate(ids, max_new_tokens=64, eos_token_id=[], return_logits=True)
    out = hf_greedy(model, ids, 64, pad_token_id=0)
    assert result.token_ids == out.sequences[0, 30:].tolist()
    assert len(result.step_logits) == len(out.logits) == 64
    for ours, theirs in zip(result.step_logits, out.logits):
        torch.testing.assert_close(ours, theirs[0].float(), atol=1e-4, rtol=0)
    assert result.prompt_computed_fraction == 1.0 and result.aux_peak_entries == 0


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_pruned_decoding_matches_slow_reference(
    arch: str, data: st.DataObject, model_pair: Callable[[str], tuple[Any, Any]]
) -> None:
    sdpa, eager = model_pair(arch)
    layers = sdpa.config.num_hidden_layers
    n = data.draw(st.integers(2, 24), label="n")
    pct = data.draw(
        st.lists(st.sampled_from([0.0, 0.0, 20.0, 50.0, 80.0]), min_size=layers - 1, max_size=layers - 1),
        label="percentiles",
    )
    steps = data.draw(st.integers(1, 6), label="steps")
    revival = data.draw(st.sampled_from(["dynamic", "frozen", "budget:0", "budget:3", "budget:40"]))
    schedule = Schedule(sdpa.config.name_or_path, (*pct, 0.0), revival=revival)
    ids = prompt(n, seed=data.draw(st.integers(0, 1000), label="seed"))
    result = LazyLLM(sdpa, schedule).generate(
        ids, max_new_tokens=steps, eos_token_id=[], return_logits=True, trace=True
    )
    ref_tokens, ref_logits, ref_count, ref_sets = reference_generate(
        eager, ids[0].tolist(), list(schedule.percentiles), steps, revival
    )

    assert result.token_ids == ref_tokens
    for ours, theirs in zip(result.step_logits, ref_logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    assert result.trace is not None and result.revival == revival
    total = n + steps - 1
    counts = result.trace.computed_counts(total)
    # each (layer, position) computed at most once, and exactly the pairs the reference computed
    assert int(counts.max()) <= 1
    assert result.trace.computed_pairs() == set(ref_count)
    assert max(ref_count.values()) == 1
    # C_{l+1} is a subset of C_l; every step attends the reference's active sets
    done = counts > 0
    assert bool((done[1:] <= done[:-1]).all())
    for step, (ours_pass, ref_layers) in enumerate(zip(result.trace.passes, ref_sets)):
        assert [set(a.tolist()) for a in ours_pass.attended] == ref_layers, f"step {step}"
    extra = result.trace.extra_pairs_per_step()
    assert result.revived_pairs == sum(extra)
    if revival == "frozen":
        assert extra == [0] * (steps - 1) and result.aux_peak_entries == 0
    if revival.startswith("budget:"):
        assert all(e <= int(revival.split(":")[1]) for e in extra)


def test_tokens_come_back_from_the_aux_cache(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    """With heavy pruning, later steps select tokens pruned earlier; they resume from the Aux Cache."""
    sdpa, eager = model_pair("llama")
    schedule = Schedule("tiny-llama", (0.0, 70.0, 0.0, 70.0, 0.0), revival="dynamic")
    ids = prompt(40, seed=11)
    result = LazyLLM(sdpa, schedule).generate(ids, max_new_tokens=8, eos_token_id=[], trace=True)
    assert result.trace is not None
    counts = result.trace.computed_counts(47)
    # layer 2 computed more prompt tokens over the generation than the prefill alone chose
    prefill_counts = schedule.keep_counts(40)
    assert int((counts[2, :40] > 0).sum()) > prefill_counts[2]
    assert result.aux_peak_entries > 0 and result.revived_pairs > 0
    assert int(counts.max()) == 1
    usage = result.prompt_computed_per_step
    assert usage == sorted(usage) and 0 < usage[0] < 1
    assert result.prompt_computed_per_step[-1] == pytest.approx(float((counts[:, :40] > 0).float().mean()))
    ref_tokens, *_ = reference_generate(eager, ids[0].tolist(), list(schedule.percentiles), 8)
    assert result.token_ids == ref_tokens


def test_frozen_decoding_attends_the_prefill_survivors(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    sdpa, _ = model_pair("qwen2")
    schedule = Schedule("tiny-qwen2", (0.0, 60.0, 0.0, 50.0, 0.0), revival="frozen")
    ids = prompt(40, seed=2)
    result = LazyLLM(sdpa, schedule).generate(ids, max_new_tokens=5, eos_token_id=[], trace=True)
    assert result.trace is not None
    prefill, *steps = result.trace.passes
    assert [int(c.shape[0]) for c in prefill.computed] == schedule.keep_counts(40)
    for k, step in enumerate(steps, start=1):
        generated = set(range(40, 40 + k))
        for layer in range(5):
            assert set(step.attended[layer].tolist()) == set(prefill.computed[layer].tolist()) | generated
            assert step.computed[layer].tolist() == [39 + k]  # only the new token
        assert step.scores == {}  # nothing ranked: no scoring work in a frozen step
    assert result.aux_peak_entries == 0 and result.revived_pairs == 0
    assert result.prompt_computed_per_step == [result.prompt_computed_per_step[0]] * 5


@pytest.mark.parametrize("revival", ["dynamic", "frozen", "budget:3"])
@pytest.mark.parametrize("scoring", ["last", "fastkv"])
def test_a_captured_prefix_gives_the_same_generation(
    revival: str, scoring: str, model_pair: Callable[[str], tuple[Any, Any]]
) -> None:
    """generate(prefix=...) starts the prefill at the first pruning layer: same tokens, logits and
    accounting as the whole prefill (what an evaluation of many schedules on one prompt relies on)."""
    sdpa, _ = model_pair("qwen2")
    ids = prompt(40, seed=5)
    keep = LazyLLM(sdpa, Schedule.keep_all("tiny-qwen2", 5))
    prefix = keep.capture_prefix(ids)
    schedule = Schedule("tiny-qwen2", (0.0, 0.0, 60.0, 40.0, 0.0), revival=revival).with_scoring(scoring)
    engine = LazyLLM(sdpa, schedule)
    whole = engine.generate(ids, max_new_tokens=6, eos_token_id=[], return_logits=True)
    resumed = engine.generate(ids, max_new_tokens=6, eos_token_id=[], return_logits=True, prefix=prefix)
    assert resumed.token_ids == whole.token_ids
    for a, b in zip(resumed.step_logits, whole.step_logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert resumed.prompt_computed_per_layer == whole.prompt_computed_per_layer
    assert resumed.prompt_computed_per_step == whole.prompt_computed_per_step
    assert (resumed.aux_peak_entries, resumed.revived_pairs) == (whole.aux_peak_entries, whole.revived_pairs)
    with pytest.raises(ValueError, match="captured from another prompt"):
        engine.generate(prompt(40, seed=6), max_new_tokens=2, prefix=prefix)
    # the prefix is really what the prefill starts from: a tampered one changes the first logits
    bent = dataclasses.replace(prefix, inputs=tuple(x + 1.0 for x in prefix.inputs))
    first = engine.generate(ids, max_new_tokens=1, eos_token_id=[], return_logits=True, prefix=bent)
    assert not torch.allclose(first.step_logits[0], whole.step_logits[0], atol=1e-3)


def test_budget_bounds_revivals_and_is_dynamic_when_large(
    model_pair: Callable[[str], tuple[Any, Any]],
) -> None:
    sdpa, _ = model_pair("llama")
    base = Schedule("tiny-llama", (0.0, 70.0, 0.0, 70.0, 0.0), revival="dynamic")
    ids = prompt(40, seed=11)
    dynamic = LazyLLM(sdpa, base).generate(ids, max_new_tokens=8, eos_token_id=[], trace=True)
    assert dynamic.trace is not None and max(dynamic.trace.extra_pairs_per_step()) > 4
    tight = LazyLLM(sdpa, base.with_revival("budget:4")).generate(
        ids, max_new_tokens=8, eos_token_id=[], trace=True
    )
    assert tight.trace is not None
    assert max(tight.trace.extra_pairs_per_step()) <= 4 < max(dynamic.trace.extra_pairs_per_step())
    assert tight.revived_pairs > 0
    large = LazyLLM(sdpa, base.with_revival("budget:100000")).generate(
        ids, max_new_tokens=8, eos_token_id=[], return_logits=True
    )
    assert large.token_ids == dynamic.token_ids and large.revived_pairs == dynamic.revived_pairs


def test_random_drop_is_seeded_and_keeps_counts(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    sdpa, _ = model_pair("llama")
    schedule = Schedule("tiny-llama", (0.0, 50.0, 0.0, 50.0, 0.0))
    ids = prompt(40, seed=5)
    a = LazyLLM(sdpa, schedule, selector=RandomSelector(seed=1)).prefill(ids)
    b = LazyLLM(sdpa, schedule, selector=RandomSelector(seed=1)).prefill(ids)
    c = LazyLLM(sdpa, schedule, selector=RandomSelector(seed=2)).prefill(ids)
    lazy = LazyLLM(sdpa, schedule).prefill(ids)
    assert [p.tolist() for p in a.computed_positions] == [p.tolist() for p in b.computed_positions]
    assert a.computed_positions[4].tolist() != c.computed_positions[4].tolist()
    assert a.active_counts == lazy.active_counts == schedule.keep_counts(40)
    assert a.computed_positions[2].tolist() != lazy.computed_positions[2].tolist()


def test_stop_rules(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    sdpa, _ = model_pair("llama")
    engine = LazyLLM(sdpa, Schedule.keep_all("tiny-llama", 5))
    ids = prompt(10, seed=7)
    free = engine.generate(ids, max_new_tokens=8, eos_token_id=[])
    assert free.finish_reason == "length" and len(free.token_ids) == 8
    eos = free.token_ids[3]
    stopped = engine.generate(ids, max_new_tokens=8, eos_token_id=eos)
    assert stopped.finish_reason == "eos"
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(eos) + 1]
    with pytest.raises(ValueError, match="needs a tokenizer"):
        engine.generate("text prompt")
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        engine.generate(ids, stop_strings=["\n"])
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate(ids, max_new_tokens=0)


class _HostReads(TorchFunctionMode):
    """Counts tensor reads that make the host wait for the device (each one stalls a GPU)."""

    READS = frozenset({"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "nonzero", "numpy"})

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in self.READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("revival", ["dynamic", "frozen"])
@pytest.mark.parametrize("decoding", ["greedy", "sampled", "stream"])
def test_decoding_without_revival_reads_the_device_once_per_step(
    revival: str, decoding: str, model_pair: Callable[[str], tuple[Any, Any]]
) -> None:
    """Keep-all (any policy) and frozen decoding: the next token is the only host read of a step, also
    when it is sampled (repetition penalty, temperature, top-k, top-p) or streamed as text."""
    sdpa, _ = model_pair("llama")
    schedules = [Schedule.keep_all("tiny-llama", 5).with_revival(revival)]
    if revival == "frozen":
        schedules.append(Schedule("tiny-llama", (0.0, 50.0, 0.0, 50.0, 0.0), revival="frozen"))
    sampled = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1, seed=0)
    for schedule in schedules:
        engine = LazyLLM(sdpa, schedule, tokenizer=_CharTokenizer())
        reads = []
        for steps in (3, 7):
            with _HostReads() as counter:
                if decoding == "stream":
                    list(engine.stream(prompt(30), max_new_tokens=steps, eos_token_id=[]))
                else:
                    options = sampled if decoding == "sampled" else {}
                    engine.generate(prompt(30), max_new_tokens=steps, eos_token_id=[], **options)
            reads.append(counter.count)
        assert reads[1] - reads[0] == 4, (schedule, reads)


class _CharTokenizer:
    """Decodes token ``i`` as one letter, on the host (what a tokenizer does with a list of ints)."""

    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + i % 26) for i in ids)
