from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from lazyllm.baselines import PromptCompression, random_drop, static_pruning
from lazyllm.engine import LazyLLM
from lazyllm.schedule import Schedule
from tests.support import prompt


class _CharTokenizer:
    """Token id i decodes to " w" for even i (a new word) and "x" for odd i (continues the word)."""

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(" w" if i % 2 == 0 else "x" for i in ids)


def test_static_pruning_prunes_once_and_never_revives(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    model, _ = model_pair("llama")
    ids = prompt(40, seed=4)
    engine = static_pruning(model, keep_fraction=0.4, score_layers=2)
    assert str(engine.schedule.revival) == "frozen"
    result = engine.generate(ids, max_new_tokens=6, eos_token_id=[], trace=True)
    assert result.trace is not None
    counts = result.trace.computed_counts(45)
    done = counts[:, :40] > 0
    kept = done[2]
    assert int(kept.sum()) == 40 - int(0.6 * 40)
    assert bool(kept[39])
    # layers 0-1 computed every prompt token once; every later layer exactly the kept ones, in every step
    assert bool(done[:2].all())
    for layer in range(2, 5):
        assert torch.equal(done[layer], kept)
    assert int(counts.max()) == 1
    assert result.prompt_computed_per_step[0] == result.prompt_computed_per_step[-1]
    assert result.revived_pairs == 0 and result.aux_peak_entries == 0
    # the decision used the mean attention of layers 0 and 1, not layer 1 alone
    lazy = LazyLLM(model, engine.schedule).prefill(ids, return_scores=True)
    static = engine.prefill(ids, return_scores=True)
    assert lazy.active_counts == static.active_counts
    mean = (static.scores[0] + static.scores[1]) / 2
    survivors = set(static.computed_positions[2].tolist())
    pruned = set(range(39)) - survivors
    assert max(float(mean[i]) for i in pruned) <= min(float(mean[i]) for i in survivors - {39})
    assert static.computed_positions[2].tolist() != lazy.computed_positions[2].tolist()
    with pytest.raises(ValueError, match="keep_fraction"):
        static_pruning(model, keep_fraction=0.0)


def test_static_decoding_sees_only_kept_prompt_tokens(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    """After the prefill, every decoding step's layers past the decision attend the kept prompt tokens."""
    model, _ = model_pair("llama")
    ids = prompt(40, seed=4)
    engine = static_pruning(model, keep_fraction=0.5, score_layers=1)
    result = engine.generate(ids, max_new_tokens=5, eos_token_id=[], trace=True)
    assert result.trace is not None and result.finish_reason == "length"
    prefill, *steps = result.trace.passes
    kept = set(prefill.computed[1].tolist())
    assert len(kept) == 20
    for k, step in enumerate(steps, start=1):
        assert set(step.attended[0].tolist()) == set(range(40 + k))
        for layer in range(1, 5):
            assert set(step.attended[layer].tolist()) == kept | set(range(40, 40 + k))


def test_random_drop_same_counts(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    model, _ = model_pair("qwen2")
    schedule = Schedule("tiny-qwen2", (0.0, 50.0, 0.0, 30.0, 0.0))
    ids = prompt(33, seed=2)
    a = random_drop(model, schedule, seed=3)
    assert a.prefill(ids).active_counts == schedule.keep_counts(33)
    r1 = a.generate(ids, max_new_tokens=4, eos_token_id=[])
    r2 = random_drop(model, schedule, seed=3).generate(ids, max_new_tokens=4, eos_token_id=[])
    assert r1.token_ids == r2.token_ids


def test_prompt_compression_drops_low_information_words(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    model, _ = model_pair("llama")
    ids = torch.tensor([list(range(0, 60))]) % 97
    pc = PromptCompression(model, _CharTokenizer(), drop_fraction=0.5, protect_first=2, protect_last=10)
    kept = pc.compress(ids)
    n_comp = 60 - 2 - 10
    assert 60 - kept.shape[1] >= int(0.5 * n_comp)
    assert 60 - kept.shape[1] <= int(0.5 * n_comp) + 2  # whole words of 2 tokens
    assert kept[0, :2].tolist() == [0, 1] and kept[0, -10:].tolist() == list(range(50, 60))
    assert kept[0].tolist() == sorted(kept[0].tolist())  # order preserved
    # the dropped words have the lowest total self-information
    info = pc.self_information(ids)
    words = {w: float(info[w : w + 2].sum()) for w in range(2, 50, 2)}
    kept_set = set(kept[0].tolist())
    dropped = [w for w in words if w not in kept_set]
    survived = [w for w in words if w in kept_set]
    assert max(words[w] for w in dropped) <= min(words[w] for w in survived)
    result = pc.generate(ids, max_new_tokens=3, eos_token_id=[])
    plain = LazyLLM(model, Schedule.keep_all("tiny-llama", 5)).generate(
        kept, max_new_tokens=3, eos_token_id=[]
    )
    assert result.token_ids == plain.token_ids
    assert result.prompt_tokens == 60
    assert result.prompt_computed_fraction == pytest.approx(kept.shape[1] / 60)
