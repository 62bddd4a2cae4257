"""Batched decoding of frozen generations (lazyllm.batch): each request gets what generate gives it alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from lazyllm import LazyLLM, Schedule
from lazyllm.batch import BatchRequest, Finished, RunningBatch, decodes_frozen, generate_batch
from lazyllm.sampling import Sampling
from tests.support import make_tiny, prompt


def _schedules(model: Any) -> list[Schedule]:
    name, layers = model.config.name_or_path, model.config.num_hidden_layers
    pruned = [0.0] * layers
    pruned[1], pruned[3] = 40.0, 50.0  # percent: on prompts of 9-40 tokens each prunes 3-20 of them
    return [
        Schedule.keep_all(name, layers),
        Schedule(name, tuple(pruned)).with_revival("frozen"),
        Schedule(name, (60.0,) + (0.0,) * (layers - 1)).with_revival("frozen"),
    ]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_every_request_gets_the_tokens_generate_gives_it_alone(tiny: Any, attn: str) -> None:
    model = tiny if attn == "sdpa" else make_tiny(tiny.config.name_or_path.removeprefix("tiny-"), attn)
    engines = [LazyLLM(model, s) for s in _schedules(model)]
    lengths = (9, 23, 40, 31)  # past the sliding windows (8) of mistral, qwen2 and gemma3
    requests = [
        BatchRequest(engine, prompt(n, seed=n)[0].tolist(), max_new_tokens=6 + (n % 5), eos_token_id=())
        for engine in engines
        for n in lengths
    ]
    batched = generate_batch(requests, batch_size=5)  # chunks of 5, 5 and 2: rows of mixed schedules
    assert len(batched) == len(requests)
    for request, got in zip(requests, batched):
        alone = request.engine.generate(
            torch.tensor(request.input_ids), max_new_tokens=request.max_new_tokens, eos_token_id=[]
        )
        assert got.token_ids == alone.token_ids
        assert got.finish_reason == alone.finish_reason == "length"
        assert got.prompt_tokens == alone.prompt_tokens
        assert got.prompt_computed_per_layer == pytest.approx(alone.prompt_computed_per_layer)
        assert got.prompt_computed_fraction == pytest.approx(alone.prompt_computed_fraction)
        assert got.revival == alone.revival
        if any(request.engine.schedule.percentiles):  # the pruned schedules really prune these prompts
            assert got.prompt_computed_fraction < 1.0


def test_rows_leave_the_batch_when_they_stop_and_prefixes_resume(tiny: Any) -> None:
    keep_all, frozen, _ = (LazyLLM(tiny, s) for s in _schedules(tiny))
    ids = [prompt(n, seed=n)[0].tolist() for n in (12, 30, 21)]
    free = [frozen.generate(torch.tensor(x), max_new_tokens=12, eos_token_id=[]) for x in ids]
    # each prompt's 4th generated token is its EOS: the rows stop at different steps
    eos = [r.token_ids[3] for r in free]
    prefixes = [keep_all.capture_prefix(x) for x in ids]
    for e, x, prefix in zip(eos, ids, prefixes):
        (got,) = generate_batch([BatchRequest(frozen, x, max_new_tokens=12, eos_token_id=e)])
        (resumed,) = generate_batch(
            [BatchRequest(frozen, x, max_new_tokens=12, prefix=prefix, eos_token_id=e)]
        )
        alone = frozen.generate(torch.tensor(x), max_new_tokens=12, eos_token_id=e)
        assert got.token_ids == resumed.token_ids == alone.token_ids
        assert got.finish_reason == alone.finish_reason == "eos"
        assert got.prompt_computed_fraction == pytest.approx(resumed.prompt_computed_fraction)
        assert got.prompt_computed_fraction < 1.0
        assert len(got.token_ids) <= 4
    limits = (12, 5, 9)  # row 0 stops at its EOS (<= 4 tokens), the others at theirs or their limit
    together = generate_batch(
        [BatchRequest(frozen, x, max_new_tokens=m, eos_token_id=eos[0]) for x, m in zip(ids, limits)]
    )
    for x, m, got in zip(ids, limits, together):
        alone = frozen.generate(torch.tensor(x), max_new_tokens=m, eos_token_id=eos[0])
        assert got.token_ids == alone.token_ids and got.finish_reason == alone.finish_reason
    assert together[0].finish_reason == "eos"
    assert len({len(got.token_ids) for got in together}) > 1  # rows left the batch at different steps


def test_a_reviving_schedule_runs_alone_and_two_models_are_refused(tiny: Any) -> None:
    name, layers = tiny.config.name_or_path, tiny.config.num_hidden_layers
    dynamic = LazyLLM(tiny, Schedule(name, (50.0,) + (0.0,) * (layers - 1), revival="dynamic"))
    frozen_engine = LazyLLM(tiny, _schedules(tiny)[1])
    assert not decodes_frozen(dynamic)
    assert decodes_frozen(LazyLLM(tiny, Schedule.keep_all(name, layers)))  # nothing to revive
    ids = [prompt(n, seed=n)[0].tolist() for n in (14, 27)]
    requests = [
        BatchRequest(e, x, max_new_tokens=6, eos_token_id=()) for e in (dynamic, frozen_engine) for x in ids
    ]
    seen: list[int] = []

    def on_token(i: int, token: int) -> bool:
        seen.append(i)
        return not (i == 1 and seen.count(1) == 3)  # cancel the second dynamic request at its 3rd token

    with pytest.warns(UserWarning, match="2 of 4 requests .* run one at a time"):
        results = generate_batch(requests, on_token=on_token)
    for request, got in zip(requests, results):
        alone = request.engine.generate(torch.tensor(request.input_ids), max_new_tokens=6, eos_token_id=[])
        assert got.revival == alone.revival
        if request is requests[1]:
            assert got.finish_reason == "cancelled" and got.token_ids == alone.token_ids[:3]
        else:
            assert got.token_ids == alone.token_ids and got.finish_reason == "length"
    assert seen[-3:] == [1, 1, 1] and seen.count(0) == 6  # the batched ones first, then each alone
    other = make_tiny(name.removeprefix("tiny-"), seed=1)
    frozen = Schedule.keep_all(name, layers)
    with pytest.raises(ValueError, match="share one model"):
        generate_batch(
            [BatchRequest(LazyLLM(tiny, frozen), [1, 2]), BatchRequest(LazyLLM(other, frozen), [1, 2])]
        )
    with pytest.raises(ValueError, match="max_new_tokens = 0"):
        BatchRequest(LazyLLM(tiny, frozen), [1, 2], max_new_tokens=0)


def test_a_forced_answer_rides_on_the_generations_prefill_with_the_same_logits(tiny: Any) -> None:
    keep_all, frozen, early = (LazyLLM(tiny, s) for s in _schedules(tiny))
    ids = [prompt(n, seed=n)[0].tolist() for n in (14, 33)]
    answers = [keep_all.generate(torch.tensor(x), max_new_tokens=7, eos_token_id=[]).token_ids for x in ids]
    for engine in (keep_all, frozen, early):
        for x, answer in zip(ids, answers):
            prefix = keep_all.capture_prefix(x)
            for given in (None, prefix):
                requests = [
                    BatchRequest(engine, x, max_new_tokens=5, eos_token_id=(), prefix=given, forced=tuple(f))
                    for f in (answer, answer[:1])
                ]
                for request, got in zip(requests, generate_batch(requests)):
                    assert request.forced is not None and got.forced_logits is not None
                    alone = engine.forced_logits(torch.tensor(x), list(request.forced), prefix=given)
                    assert torch.equal(got.forced_logits, alone)  # the same passes, bit for bit
                    plain = engine.generate(torch.tensor(x), max_new_tokens=5, eos_token_id=[])
                    assert got.token_ids == plain.token_ids  # and the answer is untouched by it
    with pytest.raises(ValueError, match="forced answer is empty"):
        BatchRequest(frozen, ids[0], forced=())


def test_force_own_gives_the_reference_of_the_answer_it_decoded(tiny: Any) -> None:
    keep_all, frozen, _ = (LazyLLM(tiny, s) for s in _schedules(tiny))
    ids = [prompt(n, seed=n)[0].tolist() for n in (11, 27, 19)]
    requests = [
        BatchRequest(engine, x, max_new_tokens=m, eos_token_id=(), force_own=True)
        for engine in (keep_all, frozen)
        for x, m in zip(ids, (6, 1, 9))
    ]
    for request, got in zip(requests, generate_batch(requests, batch_size=4)):
        assert got.forced_logits is not None and len(got.token_ids) == request.max_new_tokens
        alone = request.engine.forced_logits(torch.tensor(request.input_ids), got.token_ids)
        assert torch.equal(got.forced_logits, alone)
    with pytest.raises(ValueError, match="not both"):
        BatchRequest(frozen, ids[0], forced=(1,), force_own=True)


SAMPLED = Sampling(do_sample=True, temperature=0.9, top_k=20, top_p=0.95)


def test_sampled_rows_draw_what_generate_draws_alone_with_the_same_seed(tiny: Any) -> None:
    _, frozen, _ = (LazyLLM(tiny, s) for s in _schedules(tiny))
    ids = [prompt(n, seed=n)[0].tolist() for n in (13, 29, 20)]
    requests = [
        BatchRequest(frozen, x, max_new_tokens=10, eos_token_id=(), sampling=SAMPLED, seed=seed)
        for x, seed in zip(ids, (3, 4, 5))
    ] + [BatchRequest(frozen, ids[0], max_new_tokens=10, eos_token_id=())]  # a greedy row beside them
    for size in (1, 4):
        for request, got in zip(requests, generate_batch(requests, batch_size=size)):
            alone = frozen.generate(
                torch.tensor(request.input_ids), max_new_tokens=10, eos_token_id=[],
                generation_config=request.sampling, seed=request.seed,
            )  # fmt: skip
            assert got.token_ids == alone.token_ids, size
            assert got.sampling == alone.sampling
            assert got.prompt_computed_fraction == alone.prompt_computed_fraction < 1.0
    other = generate_batch([BatchRequest(frozen, ids[0], max_new_tokens=10, sampling=SAMPLED, seed=9)])
    assert other[0].token_ids != generate_batch(requests[:1])[0].token_ids  # the seed matters


def _rows_per_layer_call(model: Any) -> tuple[list[int], Any]:
    """Rows fed to layer 0 in each call (the layer views share the model's hooks)."""
    seen: list[int] = []
    handle = model.model.layers[0].register_forward_hook(lambda _m, args, _o: seen.append(args[0].shape[0]))
    return seen, handle


def test_on_token_sees_the_tokens_as_they_come_and_false_cancels_the_row(tiny: Any) -> None:
    _, frozen, _ = (LazyLLM(tiny, s) for s in _schedules(tiny))
    ids = [prompt(n, seed=n)[0].tolist() for n in (15, 26, 9)]
    requests = [BatchRequest(frozen, x, max_new_tokens=12, eos_token_id=()) for x in ids]
    seen: list[tuple[int, int]] = []

    def on_token(i: int, token: int) -> bool:
        seen.append((i, token))
        return not (i == 1 and sum(j == 1 for j, _ in seen) == 3)  # cancel row 1 at its 3rd token

    rows_fed, handle = _rows_per_layer_call(tiny)
    try:
        full = generate_batch(requests)
        full_rows = sum(rows_fed)
        rows_fed.clear()
        cut = generate_batch(requests, on_token=on_token)
    finally:
        handle.remove()
    for i, got in enumerate(cut):
        assert [t for j, t in seen if j == i] == got.token_ids  # in order, exactly the result's
    assert [i for i, _ in seen[:3]] == [0, 1, 2]  # each first token right after its prefill
    assert cut[1].finish_reason == "cancelled" and cut[1].token_ids == full[1].token_ids[:3]
    assert [cut[i].token_ids for i in (0, 2)] == [full[i].token_ids for i in (0, 2)]
    assert cut[0].finish_reason == "length"
    # row 1 left the batch after its 3rd token: 9 fewer decoding rows through the layers
    assert full_rows - sum(rows_fed) == 12 - 3
    everything = generate_batch(requests, on_token=lambda i, t: False)
    assert all(r.finish_reason == "cancelled" and len(r.token_ids) == 1 for r in everything)


def test_times_run_from_the_calls_start(tiny: Any) -> None:
    _, frozen, _ = (LazyLLM(tiny, s) for s in _schedules(tiny))
    requests = [
        BatchRequest(frozen, prompt(n, seed=n)[0].tolist(), max_new_tokens=4, eos_token_id=())
        for n in (30, 30, 30)
    ]
    results = generate_batch(requests, batch_size=2)
    # rows 0 and 1 share one prefill (their first tokens come after it), row 2 waited for that chunk
    assert results[0].ttft_s <= results[1].ttft_s < results[0].total_s <= results[2].ttft_s
    assert all(r.ttft_s <= r.total_s for r in results)


def _run(
    batch: RunningBatch, requests: list[BatchRequest], joins: dict[int, list[int]]
) -> dict[int, Finished]:
    """Drive ``batch``: at step ``s`` the requests ``joins[s]`` join it; until every request ended."""
    ended: dict[int, Finished] = {}
    step = 0
    while len(ended) < len(requests):
        for finished in batch.add([(k, requests[k]) for k in joins.get(step, [])]):
            ended[finished.key] = finished
        for finished in batch.step():
            ended[finished.key] = finished
        step += 1
        assert step < 200, "the batch never emptied"
    assert batch.size == 0 and batch.decoder is None
    return ended


@pytest.mark.parametrize(("arch", "compact_every"), [("llama", 64), ("gemma3", 64), ("llama", 1)])
def test_requests_that_join_a_running_batch_get_what_they_get_alone(
    arch: str, compact_every: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gemma3: sliding layers, rotary per layer type; compact_every 1: the buffers re-packed at every
    step (rows' valid slots moved to the front) change nothing either."""
    monkeypatch.setattr(RunningBatch, "COMPACT_EVERY", compact_every)
    model = make_tiny(arch)
    keep_all, frozen, early = (LazyLLM(model, s) for s in _schedules(model))
    # (engine, prompt length, max new tokens, seed: None greedy); the 40-token prompt joins late and
    # is longer than any row already decoding, so the shared cache grows under the running rows
    specs = [(frozen, 23, 12, None), (keep_all, 9, 5, 4), (early, 40, 9, None), (frozen, 31, 7, 5),
             (keep_all, 17, 10, None), (early, 12, 3, 6)]  # fmt: skip
    requests = [
        BatchRequest(e, prompt(n, seed=n)[0].tolist(), max_new_tokens=m, eos_token_id=(),
                     sampling=None if seed is None else SAMPLED, seed=seed)
        for e, n, m, seed in specs
    ]  # fmt: skip
    ended = _run(RunningBatch(), requests, {0: [0, 1], 2: [2], 3: [3, 4], 6: [5]})
    for k, request in enumerate(requests):
        alone = request.engine.generate(
            torch.tensor(request.input_ids), max_new_tokens=request.max_new_tokens, eos_token_id=[],
            generation_config=request.sampling, seed=request.seed,
        )  # fmt: skip
        got = ended[k].result
        assert ended[k].error is None and got is not None
        assert got.token_ids == alone.token_ids, k
        assert (
            got.finish_reason == "length" and got.prompt_computed_fraction == alone.prompt_computed_fraction
        )
        if any(request.engine.schedule.percentiles):
            assert got.prompt_computed_fraction < 1.0


def test_a_request_that_fails_fails_alone_and_its_neighbours_get_their_solo_tokens(tiny: Any) -> None:
    _, frozen, early = (LazyLLM(tiny, s) for s in _schedules(tiny))
    overflow = Sampling(do_sample=True, temperature=1e-300)  # logits / 1e-300: inf, then NaN probabilities
    requests = [
        BatchRequest(frozen, prompt(n, seed=n)[0].tolist(), max_new_tokens=8, eos_token_id=()) for n in (14, 27, 9)
    ] + [
        BatchRequest(frozen, prompt(20, seed=1)[0].tolist(), max_new_tokens=8, eos_token_id=(), sampling=overflow),
        BatchRequest(early, [], max_new_tokens=8, eos_token_id=()),  # an empty prompt
        BatchRequest(early, prompt(18, seed=2)[0].tolist(), max_new_tokens=8, eos_token_id=()),
    ]  # fmt: skip

    def on_token(key: int, token: int) -> bool:
        if key == 5 and token >= 0:
            raise RuntimeError("a callback bug for request 5")
        return True

    ended = _run(RunningBatch(on_token), requests, {0: [0, 3, 4], 1: [1, 5], 2: [2]})
    assert "probability tensor" in str(ended[3].error) and ended[3].result is None
    assert "input_ids is empty" in str(ended[4].error)
    assert "a callback bug for request 5" in str(ended[5].error)
    for k in (0, 1, 2):
        request = requests[k]
        alone = frozen.generate(torch.tensor(request.input_ids), max_new_tokens=8, eos_token_id=[])
        assert ended[k].error is None and ended[k].result is not None
        assert ended[k].result.token_ids == alone.token_ids
