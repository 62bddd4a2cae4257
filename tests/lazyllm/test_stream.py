"""Streaming gives the blocking call's text piece by piece; chat messages and several prompts per call.

A random 4-layer Llama with SmolLM2's real tokenizer (``tiny_folder``): its answers are random tokens,
multi-byte characters and special tokens included, which is what the incremental text must survive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lazyllm.engine import LazyLLM
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from lazyllm.text import encode_prompt

MESSAGES = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


@pytest.fixture(scope="module")
def engine(tiny_folder: Path) -> LazyLLM:
    model, tokenizer = load_model(str(tiny_folder), device="cpu")
    schedule = Schedule("tiny", (0.0, 50.0, 30.0, 0.0), revival="frozen")
    return LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False)


def _pieces(engine: LazyLLM, prompt: Any, **kwargs: Any) -> tuple[list[str], Any]:
    stream = engine.stream(prompt, **kwargs)
    with pytest.raises(RuntimeError, match="not finished"):
        stream.result  # noqa: B018
    pieces = list(stream)
    return pieces, stream.result


@pytest.mark.parametrize("decoding", [{}, {"do_sample": True, "temperature": 1.2, "top_p": 0.95, "seed": 7}])
def test_stream_yields_the_blocking_text(engine: LazyLLM, decoding: dict[str, Any]) -> None:
    prompt = "Tell me a story about a lighthouse. " * 6
    free = engine.generate(prompt, max_new_tokens=40, eos_token_id=[], **decoding)
    assert free.text and len(free.text) > 20
    # a stop string across two tokens' texts: the piece that ends with its first half must wait
    tokenizer = engine.tokenizer
    cuts = [len(tokenizer.decode(free.token_ids[:j], skip_special_tokens=True)) for j in range(8, 40)]
    at = next(
        c for c in cuts if 0 < c < len(free.text) and not any(ch.isspace() for ch in free.text[c - 1 : c + 1])
    )
    stop = free.text[at - 1 : at + 1]
    for kwargs in ({"eos_token_id": []}, {"eos_token_id": [], "stop_strings": [stop, "\n\n\n\n"]}):
        blocking = engine.generate(prompt, max_new_tokens=40, **kwargs, **decoding)
        pieces, result = _pieces(engine, prompt, max_new_tokens=40, **kwargs, **decoding)
        assert "".join(pieces) == blocking.text == result.text, kwargs
        assert result.token_ids == blocking.token_ids and result.finish_reason == blocking.finish_reason
        assert all(pieces[1:]) and len(pieces) > 5  # pieces as they come, none empty after the first
        assert 0 < result.ttft_s < result.total_s
        assert result.prompt_computed_per_step == blocking.prompt_computed_per_step
    assert blocking.finish_reason == "stop_string" and stop not in blocking.text


def test_stream_checks_its_arguments_at_the_call(engine: LazyLLM, tiny_folder: Path) -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.stream("hi", max_new_tokens=0)
    with pytest.raises(ValueError, match=r"top_p = 2\.0"):
        engine.stream("hi", do_sample=True, top_p=2.0)
    no_tokenizer = LazyLLM(engine.model, engine.schedule, strict_model_name=False)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        no_tokenizer.stream(torch.tensor([1, 2, 3]))


def test_messages_are_rendered_by_the_chat_template(engine: LazyLLM) -> None:
    tokenizer = engine.tokenizer
    ids = encode_prompt(tokenizer, MESSAGES)
    expected = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)
    assert ids[0].tolist() == list(expected["input_ids"])
    assert tokenizer.decode(ids[0]).count("<|im_start|>") == 5  # four turns and the generation prompt
    parts = [{**m, "content": [{"type": "text", "text": m["content"][:4]}, {"type": "text", "text": m["content"][4:]}]}
             for m in MESSAGES]  # fmt: skip
    assert torch.equal(encode_prompt(tokenizer, parts), ids)  # OpenAI's text parts are joined
    by_messages = engine.generate(MESSAGES, max_new_tokens=6, eos_token_id=[])
    assert by_messages.token_ids == engine.generate(ids, max_new_tokens=6, eos_token_id=[]).token_ids
    assert by_messages.prompt_tokens == ids.shape[1]
    single = engine.generate("And of Italy?", chat=True, max_new_tokens=6, eos_token_id=[])
    assert single.token_ids == engine.generate([MESSAGES[3]], max_new_tokens=6, eos_token_id=[]).token_ids
    for bad, match in [
        ([{"role": "robot", "content": "x"}], r"messages\[0\].role = 'robot'"),
        ([MESSAGES[0], {"role": "user", "content": 3}], r"messages\[1\].content must be a string"),
        ([{"content": "x"}], r"messages\[0\].role = None"),
    ]:
        with pytest.raises(ValueError, match=match):
            engine.generate(bad, max_new_tokens=2)


def test_generate_many_equals_one_call_each(engine: LazyLLM) -> None:
    prompts: list[Any] = ["first prompt", MESSAGES, torch.tensor([5, 6, 7, 8])]
    options = dict(max_new_tokens=5, eos_token_id=[], do_sample=True, seed=3)
    many = engine.generate_many(prompts, **options)
    assert [r.token_ids for r in many] == [engine.generate(p, **options).token_ids for p in prompts]
    assert len({tuple(r.token_ids) for r in many}) == 3
    with pytest.raises(ValueError, match="list of prompts"):
        engine.generate_many("one prompt")
