"""Sampling with transformers' names and meaning: keep-all + seed gives ``model.generate``'s tokens, the
pruning does not depend on how tokens are chosen, and bad settings are one clear error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from transformers import GenerationConfig

from lazyllm.engine import LazyLLM
from lazyllm.sampling import Sampling
from lazyllm.schedule import Schedule
from tests.support import prompt

DECODINGS: dict[str, dict[str, Any]] = {
    "greedy+repetition": dict(do_sample=False, repetition_penalty=1.3),
    "temperature+top_k": dict(do_sample=True, temperature=0.7, top_k=10),
    "top_p": dict(do_sample=True, top_p=0.8),
    "all": dict(do_sample=True, temperature=1.3, top_k=20, top_p=0.9, repetition_penalty=1.2),
}


def hf_generate(model: Any, ids: torch.Tensor, n: int, seed: int, **decoding: Any) -> list[int]:
    """transformers' own ``generate`` of ``n`` tokens after ``torch.manual_seed(seed)``, never stopping."""
    config = GenerationConfig(max_new_tokens=n, eos_token_id=[], pad_token_id=0, **decoding)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    tokens: list[int] = out[0, ids.shape[1] :].tolist()
    assert len(tokens) == n  # no early stop: the comparison covers every step
    return tokens


@pytest.mark.parametrize("name", sorted(DECODINGS))
@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # the two most different of tests.support.ARCHS
def test_keep_all_with_a_seed_equals_transformers_generate(
    arch: str, name: str, model_pair: Callable[[str], tuple[Any, Any]]
) -> None:
    model, _ = model_pair(arch)
    engine = LazyLLM(model, Schedule.keep_all(model.config.name_or_path, model.config.num_hidden_layers))
    ids = prompt(24, seed=5)
    for seed in (0, 1):
        theirs = hf_generate(model, ids, 24, seed, **DECODINGS[name])
        ours = engine.generate(ids, max_new_tokens=24, eos_token_id=[], seed=seed, **DECODINGS[name])
        assert ours.token_ids == theirs, (arch, name, seed)
        assert ours.sampling == Sampling(**DECODINGS[name], seed=seed)


def test_a_generation_config_means_the_same_as_keywords(model_pair: Callable[[str], tuple[Any, Any]]) -> None:
    model, _ = model_pair("llama")
    engine = LazyLLM(model, Schedule.keep_all("tiny-llama", 5))
    ids = prompt(16, seed=2)
    config = GenerationConfig(do_sample=True, temperature=0.8, top_p=0.9)
    by_config = engine.generate(ids, max_new_tokens=20, eos_token_id=[], generation_config=config, seed=3)
    assert by_config.sampling == Sampling(do_sample=True, temperature=0.8, top_k=50, top_p=0.9, seed=3)
    assert by_config.token_ids == hf_generate(model, ids, 20, 3, do_sample=True, temperature=0.8, top_p=0.9)
    again = engine.generate(ids, max_new_tokens=20, eos_token_id=[], generation_config=by_config.sampling)
    other_seed = engine.generate(ids, max_new_tokens=20, eos_token_id=[], generation_config=config, seed=4)
    assert again.token_ids == by_config.token_ids and other_seed.token_ids != by_config.token_ids
    # a keyword overrides the config: temperature 0.8 -> greedy
    greedy = engine.generate(
        ids, max_new_tokens=20, eos_token_id=[], generation_config=config, do_sample=False
    )
    assert greedy.token_ids == engine.generate(ids, max_new_tokens=20, eos_token_id=[]).token_ids


@pytest.mark.parametrize("revival", ["dynamic", "frozen"])
def test_pruning_does_not_depend_on_the_decoding_strategy(
    revival: str, model_pair: Callable[[str], tuple[Any, Any]]
) -> None:
    """A sampled answer's step logits are exactly the teacher-forced logits along it: the passes are the
    schedule's, whatever chose the tokens; the prefill prunes the same tokens as greedy decoding."""
    model, _ = model_pair("llama")
    schedule = Schedule("tiny-llama", (0.0, 50.0, 0.0, 40.0, 0.0), revival=revival)
    engine = LazyLLM(model, schedule)
    ids = prompt(30, seed=9)
    sampled = engine.generate(
        ids, max_new_tokens=12, eos_token_id=[], do_sample=True, temperature=1.5, seed=0,
        return_logits=True, trace=True,
    )  # fmt: skip
    greedy = engine.generate(ids, max_new_tokens=12, eos_token_id=[], trace=True)
    assert sampled.token_ids != greedy.token_ids  # a different answer ...
    forced = engine.forced_logits(ids, sampled.token_ids)
    torch.testing.assert_close(torch.stack(sampled.step_logits), forced, atol=1e-5, rtol=0)
    assert sampled.trace is not None and greedy.trace is not None
    first_sampled, first_greedy = sampled.trace.passes[0], greedy.trace.passes[0]
    assert [p.tolist() for p in first_sampled.computed] == [p.tolist() for p in first_greedy.computed]
    assert sampled.prompt_computed_per_step[0] == greedy.prompt_computed_per_step[0] < 1.0


def test_sampling_settings_are_checked() -> None:
    for bad, match in [
        (dict(temperature=0.0), "temperature = 0.0: must be > 0"),
        (dict(top_p=1.5), r"top_p = 1.5: must be in \(0, 1\]"),
        (dict(top_k=-1), "top_k = -1"),
        (dict(repetition_penalty=0), "repetition_penalty = 0.0"),
        (dict(seed=-3), "seed = -3"),
        (dict(do_sample="yes"), "do_sample = 'yes'"),
        (dict(temperature="hot"), "temperature = 'hot': must be a number"),
    ]:
        with pytest.raises(ValueError, match=match):
            Sampling(**bad)
    with pytest.raises(ValueError, match="num_beams = 4 is not supported"):
        Sampling.from_generation_config(GenerationConfig(num_beams=4))
    with pytest.raises(ValueError, match=r"min_p = 0\.1 is not supported"):
        Sampling.resolve(GenerationConfig(do_sample=True, min_p=0.1))
    assert Sampling.from_generation_config(GenerationConfig()) == Sampling()
    assert Sampling.resolve(None, top_k=None, temperature=0.5) == Sampling(temperature=0.5)
    assert [type(p).__name__ for p in Sampling(**DECODINGS["all"]).processors()] == [
        "RepetitionPenaltyLogitsProcessor", "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper",
    ]  # fmt: skip
    assert len(Sampling(temperature=0.5, top_k=3).processors()) == 0  # warpers only apply when sampling


@pytest.mark.integration
def test_smollm2_keep_all_with_a_seed_equals_transformers_generate(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    text = (
        "The harbour town kept its lighthouse lit every night of the year. " * 20
        + "What did the town keep lit?"
    )
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    engine = LazyLLM(model, Schedule.keep_all("smollm2-135m", 30), tokenizer=tokenizer)
    for decoding in (
        dict(do_sample=False, repetition_penalty=1.2),
        dict(do_sample=True, temperature=0.7, top_k=50, top_p=0.9),
        dict(do_sample=True, temperature=1.4, top_k=0, top_p=1.0),
    ):
        theirs = hf_generate(model, ids, 24, 4, **decoding)
        ours = engine.generate(ids, max_new_tokens=24, eos_token_id=[], seed=4, **decoding)
        assert ours.token_ids == theirs, decoding
