"""lazyllm.apply: a schedule inside transformers' own ``model.generate``, on left-padded batches, and a
model left exactly as it was."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

import lazyllm
from lazyllm import LazyLLM, Schedule
from tests.support import make_tiny, prompt

PAD = 0
LENGTHS = (9, 23, 16)  # past the sliding windows (8) of qwen2 and gemma3


def _pruned(model: Any, revival: str = "frozen") -> Schedule:
    layers = model.config.num_hidden_layers
    percentiles = [0.0] * layers
    percentiles[1], percentiles[3] = 40.0, 50.0
    return Schedule(model.config.name_or_path, tuple(percentiles)).with_revival(revival)


def _batch(lengths: tuple[int, ...] = LENGTHS) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Prompts ``[1, n]`` and their left-padded batch: input_ids and attention_mask ``[B, max n]``."""
    prompts = [prompt(n, seed=n) for n in lengths]
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - p.shape[1] :] = p[0]
        mask[b, width - p.shape[1] :] = 1
    return prompts, ids, mask


def _generate(model: Any, ids: torch.Tensor, mask: torch.Tensor, **options: Any) -> Any:
    options = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": PAD, **options}
    return model.generate(input_ids=ids, attention_mask=mask, **options)


def _snapshot(model: Any) -> dict[str, Any]:
    """What must not change: the instance's attributes (by identity), config, generation config,
    attention implementation, and which ``generate``/``forward`` an attribute lookup finds."""
    return {
        "dict": dict(model.__dict__),
        "config": model.config.to_dict(),
        "generation_config": model.generation_config.to_dict(),
        "attn": model.config._attn_implementation,
        "generate": model.generate.__func__,
        "forward": model.forward.__func__,
    }


def _assert_unchanged(model: Any, before: dict[str, Any]) -> None:
    after = _snapshot(model)
    assert after["dict"].keys() == before["dict"].keys()
    assert all(after["dict"][k] is v for k, v in before["dict"].items())
    assert after == before
    assert after["generate"] is type(model).generate and after["forward"] is type(model).forward


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2"])
def test_a_pruned_batch_gives_each_row_what_lazyllm_generate_gives_it_alone(arch: str) -> None:
    model = make_tiny(arch)
    engine = LazyLLM(model, _pruned(model))
    prompts, ids, mask = _batch()
    free = [engine.generate(p, max_new_tokens=8, eos_token_id=[]).token_ids for p in prompts]
    eos = free[0][3]  # row 0 stops at its 4th token: later steps pad it
    alone = [engine.generate(p, max_new_tokens=8, eos_token_id=eos).token_ids for p in prompts]
    before = _snapshot(model)
    with lazyllm.apply(model, engine.schedule):
        out = _generate(model, ids, mask, eos_token_id=eos)
    _assert_unchanged(model, before)
    width = ids.shape[1]
    assert torch.equal(out[:, :width], ids)  # the prompts come back as given
    for b, tokens in enumerate(alone):
        row = out[b, width:].tolist()
        assert row[: len(tokens)] == tokens, b
        assert all(t == PAD for t in row[len(tokens) :])  # transformers pads a finished row
    assert len(alone[0]) <= 4 and out.shape[1] == width + max(len(t) for t in alone)
    plain = _generate(model, ids, mask, eos_token_id=eos)
    assert not torch.equal(plain, out)  # the pruning changed something, so the test could fail


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_keep_all_gives_plain_generates_tokens_greedy_and_sampled(arch: str) -> None:
    model = make_tiny(arch)
    keep_all = Schedule.keep_all(model.config.name_or_path, model.config.num_hidden_layers)
    _, ids, mask = _batch()
    sampled = dict(do_sample=True, temperature=0.8, top_k=20, top_p=0.95, repetition_penalty=1.1)
    rich = dict(max_new_tokens=10, eos_token_id=None, return_dict_in_generate=True, output_logits=True)
    for options in ({}, sampled):
        torch.manual_seed(7)
        plain = _generate(model, ids, mask, **rich, **options)
        torch.manual_seed(7)
        with lazyllm.apply(model, keep_all):
            ours = _generate(model, ids, mask, **rich, **options)
        assert torch.equal(ours.sequences, plain.sequences), options
        # every step's logits, not only their argmax: positions, masks and caches agree
        torch.testing.assert_close(torch.stack(ours.logits), torch.stack(plain.logits), rtol=1e-4, atol=1e-4)


def test_sampling_at_batch_one_draws_what_lazyllm_generate_draws_with_the_seed() -> None:
    model = make_tiny("llama")
    schedule = _pruned(model)
    engine = LazyLLM(model, schedule)
    options: dict[str, Any] = dict(do_sample=True, temperature=0.9, top_k=30)
    for seed in (1, 2):
        p = prompt(21, seed=seed)
        alone = engine.generate(p, max_new_tokens=10, eos_token_id=[], seed=seed, **options)
        torch.manual_seed(seed)
        with lazyllm.apply(model, schedule):
            out = model.generate(p, max_new_tokens=10, eos_token_id=None, pad_token_id=PAD, **options)
        assert out[0, p.shape[1] :].tolist() == alone.token_ids, seed


class _Collect(BaseStreamer):
    """A streamer that keeps what ``generate`` hands it (``put`` per step, ``end`` once)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.puts: list[torch.Tensor] = []
        self.ended = 0
        self.fail_at = fail_at

    def put(self, value: torch.Tensor) -> None:
        if self.fail_at is not None and len(self.puts) == self.fail_at:
            raise RuntimeError("streamer broke")
        self.puts.append(value.clone())

    def end(self) -> None:
        self.ended += 1


class _StopAfter(StoppingCriteria):
    """Stops every row once ``steps`` tokens are generated, or raises at that step."""

    def __init__(self, width: int, steps: int, fail: bool = False) -> None:
        self.width, self.steps, self.fail = width, steps, fail

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        done = input_ids.shape[1] - self.width >= self.steps
        if done and self.fail:
            raise RuntimeError("criteria broke")
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool)


def test_stopping_criteria_streamers_config_and_dict_outputs_behave_as_transformers_says() -> None:
    model = make_tiny("gemma3")
    schedule = _pruned(model)
    _, ids, mask = _batch()
    width = ids.shape[1]
    streamer = _Collect()
    config = GenerationConfig(max_new_tokens=12, do_sample=False, pad_token_id=PAD, eos_token_id=None)
    with lazyllm.apply(model, schedule):
        full = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        stopped = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=config, streamer=streamer,
            stopping_criteria=StoppingCriteriaList([_StopAfter(width, 5)]),
        )  # fmt: skip
        rich = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=config, return_dict_in_generate=True,
            output_logits=True, output_scores=True,
        )  # fmt: skip
    assert full.shape == (3, width + 12) and torch.equal(stopped, full[:, : width + 5])
    assert torch.equal(streamer.puts[0], ids) and streamer.ended == 1  # the prompt first, then each step
    assert torch.equal(torch.stack([p for p in streamer.puts[1:]], dim=1), stopped[:, width:])
    assert torch.equal(rich.sequences, full) and len(rich.logits) == 12
    assert torch.equal(torch.stack(rich.logits, dim=1).argmax(-1), full[:, width:])  # greedy on our logits


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_model_is_unchanged_after_an_exception_mid_generation(arch: str) -> None:
    model = make_tiny(arch)
    schedule = _pruned(model)
    _, ids, mask = _batch()
    width = ids.shape[1]
    reference = _generate(model, ids, mask)
    before = _snapshot(model)
    breakers = (
        dict(stopping_criteria=StoppingCriteriaList([_StopAfter(width, 3, fail=True)])),
        dict(streamer=_Collect(fail_at=2)),
    )
    for breaker in breakers:
        with pytest.raises(RuntimeError, match="broke"), lazyllm.apply(model, schedule):
            _generate(model, ids, mask, **breaker)
        _assert_unchanged(model, before)
        assert torch.equal(_generate(model, ids, mask), reference)
    with lazyllm.apply(model, schedule):  # and a direct call inside the block is the plain model
        with torch.inference_mode():
            assert torch.equal(
                model(input_ids=ids, attention_mask=mask).logits, model.forward(ids, mask).logits
            )
            plain_logits = type(model).forward(model, input_ids=ids, attention_mask=mask).logits
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits, plain_logits)
        with pytest.raises(ValueError, match="already active"), lazyllm.apply(model, schedule):
            pass
    _assert_unchanged(model, before)


@pytest.mark.parametrize(
    ("option", "value"),
    [("num_beams", 2), ("num_return_sequences", 2), ("use_cache", False), ("output_attentions", True)],
)
def test_an_unsupported_option_is_refused_by_name(option: str, value: Any) -> None:
    model = make_tiny("llama")
    _, ids, mask = _batch()
    before = _snapshot(model)
    with lazyllm.apply(model, _pruned(model)):
        with pytest.raises(ValueError, match=f"{option} = {value!r} is not supported"):
            _generate(model, ids, mask, **{option: value})
        positional = GenerationConfig(
            do_sample=True, pad_token_id=PAD, **{option: value}
        )  # generate(inputs, config)
        with pytest.raises(ValueError, match=f"{option} = {value!r} is not supported"):
            model.generate(ids, positional, attention_mask=mask)
        with pytest.raises(ValueError, match="assistant_model"):
            _generate(model, ids, mask, assistant_model=model)
        right = mask.flip(1)  # right padding
        with pytest.raises(ValueError, match="padding_side='left'"):
            _generate(model, ids.flip(1), right)
    _assert_unchanged(model, before)


def test_a_reviving_schedule_decodes_rows_alone_with_a_warning() -> None:
    model = make_tiny("llama")
    engine = LazyLLM(model, _pruned(model, revival="dynamic"))
    prompts, ids, mask = _batch()
    alone = [engine.generate(p, max_new_tokens=8, eos_token_id=[]).token_ids for p in prompts]
    with lazyllm.apply(model, engine.schedule), pytest.warns(UserWarning, match="decode one at a time"):
        out = _generate(model, ids, mask, eos_token_id=None)
    assert out[:, ids.shape[1] :].tolist() == alone


@pytest.mark.integration
def test_a_pipeline_and_a_text_streamer_on_smollm2(
    smollm2: tuple[Any, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import TextStreamer, pipeline

    model, tokenizer = smollm2
    name, layers = model.config.name_or_path, model.config.num_hidden_layers
    schedule = Schedule.paper_style(name, layers).with_revival("frozen")
    text = " ".join(["The harbour town kept its lighthouse lit every night of the year."] * 12)
    text += "\nQuestion: What did the town keep lit?\nAnswer:"
    # a pipeline given a string sends it raw, without the chat template
    alone = LazyLLM(model, schedule, tokenizer=tokenizer).generate(text, max_new_tokens=10, chat=False)
    plain = LazyLLM(model, Schedule.keep_all(name, layers), tokenizer=tokenizer).generate(
        text, max_new_tokens=10, chat=False
    )
    assert plain.text != alone.text  # so the pipeline's answer tells which one ran
    before = _snapshot(model)
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    with lazyllm.apply(model, schedule):
        (got,) = pipe(text, max_new_tokens=10, do_sample=False, return_full_text=False)
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        capsys.readouterr()
        model.generate(
            ids, max_new_tokens=10, do_sample=False, streamer=TextStreamer(tokenizer, skip_prompt=True)
        )
    _assert_unchanged(model, before)
    assert got["generated_text"] == alone.text
    assert capsys.readouterr().out.strip() == (alone.text or "").strip()
