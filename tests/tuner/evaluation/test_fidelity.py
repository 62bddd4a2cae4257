"""tuner.evaluation.fidelity: teacher-forced drift is exact for keep-all, positive for real pruning, cached as safetensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from lazyllm.engine import LazyLLM
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from tests.support import longbench_dir, make_tiny, prompt
from tuner.evaluation.fidelity import (
    FidelityEvaluator,
    ReferenceCache,
    drift,
    forced_logits,
    reference_from_logits,
)
from tuner.evaluation.runner import Evaluator
from tuner.study.settings import EvalSettings


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_forced_logits_reproduce_generate(arch: str) -> None:
    """Forced along its own greedy answer, a pruned engine that revives tokens gives generate's
    per-step logits exactly (step by step, the same passes; frozen decoding: the next test)."""
    model = make_tiny(arch)
    layers = model.config.num_hidden_layers
    sched = Schedule.from_layers("tiny", layers, {1: 50, 3: 40}).with_revival("dynamic")
    engine = LazyLLM(model, sched, strict_model_name=False)
    ids = prompt(40, seed=1)
    out = engine.generate(ids, max_new_tokens=6, eos_token_id=[], return_logits=True)
    forced = forced_logits(engine, ids[0], out.token_ids)
    assert forced.shape == (6, model.config.vocab_size)
    assert torch.equal(forced, torch.stack(out.step_logits))


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen2", "mistral"])
def test_frozen_forced_logits_in_one_pass_equal_the_steps(arch: str) -> None:
    """With frozen revival the steps after the prefill run as one pass; the logits are generate's
    (step by step) to float rounding, through sliding windows (window 8 < the 40-token prompt)."""
    model = make_tiny(arch)
    layers = model.config.num_hidden_layers
    sched = Schedule.from_layers("tiny", layers, {1: 50, 3: 40}).with_revival("frozen")
    engine = LazyLLM(model, sched, strict_model_name=False)
    ids = prompt(40, seed=3)
    out = engine.generate(ids, max_new_tokens=12, eos_token_id=[], return_logits=True)
    forced = forced_logits(engine, ids[0], out.token_ids)
    steps = torch.stack(out.step_logits)
    assert forced.shape == steps.shape == (12, model.config.vocab_size)
    assert torch.equal(forced[0], steps[0])  # the prefill row: the same pass
    torch.testing.assert_close(forced, steps, atol=1e-5, rtol=1e-5)
    # the forced tokens, not the argmax, feed the batch: another first token changes the rows after it
    swapped = (out.token_ids[0] + 1) % model.config.vocab_size
    other = forced_logits(engine, ids[0], [swapped, *out.token_ids[1:]])
    assert torch.equal(other[0], forced[0]) and not torch.allclose(other[1], forced[1])


@pytest.mark.parametrize(
    ("arch", "revival", "scoring"),
    [("llama", "frozen", "last"), ("gemma3", "frozen", "last"), ("qwen2", "dynamic", "last"),
     ("llama", "frozen", "fastkv"), ("llama", "frozen", "w1-softmax-none-mean-stage")],
)  # fmt: skip
def test_a_prefill_resumed_from_the_unpruned_prefix_is_bit_identical(
    arch: str, revival: str, scoring: str
) -> None:
    """A schedule first pruning after layer 2 starts its prefill there from the keep-all prefix:
    exactly the logits of computing layers 0-2 itself (twice, so nothing in the prefix was changed);
    a rule that observes earlier layers (stage-mean) resumes no later than its first observed one."""
    model = make_tiny(arch)
    layers = model.config.num_hidden_layers
    keep = LazyLLM(model, Schedule.keep_all("tiny", layers), strict_model_name=False)
    sched = Schedule.from_layers("tiny", layers, {2: 50, 3: 40}).with_revival(revival).with_scoring(scoring)
    engine = LazyLLM(model, sched, strict_model_name=False)
    ids = prompt(40, seed=5)
    prefix = keep.capture_prefix(ids[0])
    assert prefix.depth == layers - 1 and prefix.inputs[0].shape == (1, 40, model.config.hidden_size)
    answer = [3, 9, 27, 81, 43]
    full = forced_logits(engine, ids[0], answer)
    for _ in range(2):
        assert torch.equal(forced_logits(engine, ids[0], answer, prefix), full)
    with pytest.raises(ValueError, match="another prompt"):
        forced_logits(engine, prompt(40, seed=6)[0], answer, prefix)
    with pytest.raises(ValueError, match="prunes nothing"):
        engine.capture_prefix(ids[0])


def test_fidelity_evaluator_keeps_prefixes_within_its_memory_cap(tiny_folder: Path, tmp_path: Path) -> None:
    model, tokenizer = load_model(str(tiny_folder))
    cfg = EvalSettings(model=str(tiny_folder), task="qa", n_examples=3, max_prompt_tokens=64,
                       max_new_tokens=4, data_dir=longbench_dir())  # fmt: skip
    ev = Evaluator(model, tokenizer, cfg, tmp_path / "cache", progress=False)
    layers = model.config.num_hidden_layers
    pruned = LazyLLM(
        model, Schedule.from_layers(model.config.name_or_path, layers, {1: 50}), strict_model_name=False
    )
    full = FidelityEvaluator(ev, prefix_bytes=0).evaluate(pruned)[0]
    fid = FidelityEvaluator(ev)
    assert fid.evaluate(pruned)[0] == full  # the same drift, example by example
    kept = [p for p in fid.prefixes.values() if p is not None]
    assert len(kept) == len(ev.examples) > 1
    one = kept[0].nbytes
    capped = FidelityEvaluator(ev, prefix_bytes=int(1.5 * one))
    assert capped.evaluate(pruned)[0] == full
    assert sum(p is not None for p in capped.prefixes.values()) == 1  # the rest ran in full


def test_by_default_prefixes_are_kept_within_a_share_of_free_memory(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fixed cap: the share of the memory free when the first prefix is captured (so a study's
    evaluators built later see what earlier ones left); a share of 0 keeps none, and bad caps are refused."""
    from tuner.evaluation import fidelity
    from tuner.evaluation.fidelity import PREFIX_MEMORY_SHARE
    from tuner.stages.trial import prefix_share
    from tuner.study.settings import SearchSettings

    model, tokenizer = load_model(str(tiny_folder))
    cfg = EvalSettings(model=str(tiny_folder), task="qa", n_examples=2, max_prompt_tokens=64,
                       max_new_tokens=4, data_dir=longbench_dir())  # fmt: skip
    ev = Evaluator(model, tokenizer, cfg, tmp_path / "cache", progress=False)
    # every reading of free memory, counted (the real one: free memory moves between two readings)
    reads: list[int] = []
    real = fidelity.free_memory_bytes

    def counted(device: torch.device) -> int:
        reads.append(real(device))
        return reads[-1]

    monkeypatch.setattr(fidelity, "free_memory_bytes", counted)
    fid = FidelityEvaluator(ev)
    assert reads == []  # not read when built
    share = fid.prefix_bytes
    assert len(reads) == 1 and reads[0] > 0 and share == int(PREFIX_MEMORY_SHARE * reads[0])  # one reading
    assert fid.prefix_bytes == share and len(reads) == 1  # fixed on first use: not read again
    layers = model.config.num_hidden_layers
    pruned = LazyLLM(
        model, Schedule.from_layers(model.config.name_or_path, layers, {1: 50}), strict_model_name=False
    )
    fid.evaluate(pruned)
    assert all(p is not None for p in fid.prefixes.values()) and len(fid.prefixes) == len(ev.examples)
    none = FidelityEvaluator(ev, prefix_share=0.0)
    none.evaluate(pruned)
    assert none.prefix_bytes == 0 and all(p is None for p in none.prefixes.values())
    assert prefix_share(SearchSettings(n_workers=4)) == pytest.approx(PREFIX_MEMORY_SHARE / 4)
    with pytest.raises(ValueError, match="prefix_bytes = -1: must be >= 0"):
        FidelityEvaluator(ev, prefix_bytes=-1)
    with pytest.raises(ValueError, match=r"prefix_share = 1.5: must be in \[0, 1\]"):
        FidelityEvaluator(ev, prefix_share=1.5)


def test_schedules_scored_together_equal_each_scored_alone(tiny_folder: Path, tmp_path: Path) -> None:
    """score_together goes example by example from each prompt's prefix: every engine's answers and
    KLs are those of evaluating it alone, and a prefix the cache did not hold is not kept."""
    model, tokenizer = load_model(str(tiny_folder))
    cfg = EvalSettings(model=str(tiny_folder), task="qa", n_examples=3, max_prompt_tokens=64,
                       max_new_tokens=4, data_dir=longbench_dir())  # fmt: skip
    ev = Evaluator(model, tokenizer, cfg, tmp_path / "cache", progress=False)
    layers, name = model.config.num_hidden_layers, model.config.name_or_path
    engines = {
        7: LazyLLM(model, Schedule.from_layers(name, layers, {1: 50}).with_revival("frozen"), tokenizer=tokenizer,
                   strict_model_name=False),
        9: LazyLLM(model, Schedule.from_layers(name, layers, {2: 60}).with_scoring("fastkv"), tokenizer=tokenizer,
                   strict_model_name=False),
    }  # fmt: skip
    fid = FidelityEvaluator(ev, prefix_bytes=0)  # nothing cached: every prefix is captured and dropped
    together = fid.score_together(engines, kl=True)
    assert all(p is None for p in fid.prefixes.values())
    for number, engine in engines.items():
        results, drifts = together[number]
        alone, _ = ev.evaluate("lazyllm", engine)
        assert [(r.record_id, r.prediction, r.score) for r in results] == [
            (r.record_id, r.prediction, r.score) for r in alone
        ]
        expected, _ = FidelityEvaluator(ev, prefix_bytes=0).evaluate(engine)
        for got, want in zip(drifts, expected, strict=True):
            assert got.record_id == want.record_id and got.kl == pytest.approx(want.kl, abs=1e-6)
    assert together[7][0] != together[9][0] or together[7][1] != together[9][1]  # two schedules, two rows
    assert fid.score_together(engines, kl=False)[7][1] == []  # no KL asked, none computed


def _frozen_engines(model: Any, tokenizer: Any, plans: dict[int, dict[int, float]]) -> dict[int, LazyLLM]:
    """Engines with frozen revival, numbered as ``plans`` (number -> {layer: percentile})."""
    layers, name = model.config.num_hidden_layers, model.config.name_or_path
    return {
        n: LazyLLM(model, Schedule.from_layers(name, layers, plan).with_revival("frozen"), tokenizer=tokenizer,
                   strict_model_name=False)
        for n, plan in plans.items()
    }  # fmt: skip


def _count_unpruned_prefills(fid: FidelityEvaluator) -> tuple[list[int], list[int]]:
    """Record every prefix ``fid`` captures and every full unpruned prefill it runs; its evaluator's
    own baseline generator is disabled (a call to it fails the test)."""
    captures: list[int] = []
    full_prefills: list[int] = []
    capture, forward = fid.keep_all.capture_prefix, fid.keep_all.forward_pass

    def counted_forward(gen: Any, ids: Any, start: int, **kw: Any) -> Any:
        if start == 0 and kw.get("prefix") is None:
            full_prefills.append(1)
        return forward(gen, ids, start, **kw)

    fid.keep_all.capture_prefix = lambda ids: captures.append(1) or capture(ids)  # type: ignore[method-assign]
    fid.keep_all.forward_pass = counted_forward  # type: ignore[method-assign]

    def refuse(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the evaluator's own baseline generator ran a prefill")

    fid.evaluator.baseline_engine.forward_pass = refuse
    return captures, full_prefills


def test_an_evaluator_that_keeps_no_prefill_captures_none(tiny_folder: Path, tmp_path: Path) -> None:
    """prefix_bytes=0 (the fresh-drift check's prompts: a capture costs more than the few schedules
    checked there save): with the unpruned side cached, a trial runs each prompt's whole pruned prefill
    and no unpruned one, and drifts as much as from a kept prefix."""
    model, tokenizer = load_model(str(tiny_folder))
    cfg = EvalSettings(model=str(tiny_folder), task="qa", n_examples=3, max_prompt_tokens=64,
                       max_new_tokens=4, data_dir=longbench_dir())  # fmt: skip
    ev = Evaluator(model, tokenizer, cfg, tmp_path / "cache", progress=False)
    kept = FidelityEvaluator(ev)
    engine = _frozen_engines(model, tokenizer, {1: {1: 50}})[1]
    want, _ = kept.evaluate(engine)
    none = FidelityEvaluator(ev, prefix_bytes=0)
    none.references()  # read from the cache
    captures, full_prefills = _count_unpruned_prefills(none)
    got, _ = none.evaluate(engine)
    assert captures == [] and full_prefills == [] and set(none.prefixes.values()) == {None}
    assert [d.kl for d in got] == pytest.approx([d.kl for d in want], abs=1e-6)


@pytest.mark.parametrize("kl", [True, False])
def test_scoring_on_new_examples_takes_one_unpruned_prefill_per_example_for_everything(
    tiny_folder: Path, tmp_path: Path, kl: bool
) -> None:
    """score_together on examples the study has no baseline for (the calibration's, the test split's)
    computes the baseline (and with ``kl`` the reference) from the same captured prefix the engines
    resume from: one capture per example, no other unpruned prefill, and the same baseline answers,
    task scores and KLs as computing each apart."""
    model, tokenizer = load_model(str(tiny_folder))
    cfg = EvalSettings(model=str(tiny_folder), task="qa", n_examples=4, max_prompt_tokens=64,
                       max_new_tokens=5, data_dir=longbench_dir())  # fmt: skip
    apart = Evaluator(model, tokenizer, cfg, tmp_path / "apart", progress=False)
    engines = _frozen_engines(model, tokenizer, {3: {1: 50}, 5: {2: 70}})
    base_apart = apart.baseline()
    want = {n: apart.evaluate("lazyllm", e)[0] for n, e in engines.items()}
    want_kl = {n: FidelityEvaluator(apart).evaluate(e)[0] for n, e in engines.items()}

    together = Evaluator(model, tokenizer, cfg, tmp_path / "together", progress=False)
    fid = FidelityEvaluator(together, prefix_bytes=1 << 30)
    captures, full_prefills = _count_unpruned_prefills(fid)
    got = fid.score_together(engines, kl=kl)
    assert len(captures) == len(together.examples) > 2 and not full_prefills
    assert not fid.prefixes  # captured for their chunk only
    for ex in together.examples:
        entry = together.cache.entries[ex.key]
        assert (entry.prediction, entry.score, entry.token_ids) == (
            base_apart[ex.key].prediction, base_apart[ex.key].score, base_apart[ex.key].token_ids,
        )  # fmt: skip
        assert (ex.key in fid.cache.entries) == kl
    for number in engines:
        results, drifts = got[number]
        assert [(r.record_id, r.prediction, r.score) for r in results] == [
            (r.record_id, r.prediction, r.score) for r in want[number]
        ]
        if kl:
            assert [d.kl for d in drifts] == pytest.approx([d.kl for d in want_kl[number]], abs=1e-6)
        else:
            assert drifts == []


def test_a_larger_set_adopts_the_unpruned_side_of_the_examples_it_shares(
    tiny_folder: Path, tmp_path: Path
) -> None:
    """The calibration's examples begin with the search's: their baseline, reference and kept prefix
    are taken over (no capture), the others computed, and every answer and KL is what a fresh
    evaluator computes; settings that differ adopt nothing."""
    model, tokenizer = load_model(str(tiny_folder))

    def config(n: int) -> EvalSettings:
        return EvalSettings(model=str(tiny_folder), task="qa", n_examples=n, max_prompt_tokens=64,
                            max_new_tokens=5, data_dir=longbench_dir())  # fmt: skip

    small = FidelityEvaluator(Evaluator(model, tokenizer, config(1), tmp_path / "small", progress=False))
    small.references()
    big_ev = Evaluator(model, tokenizer, config(3), tmp_path / "big", progress=False)
    shared = {ex.key for ex in small.evaluator.examples}
    assert shared < {ex.key for ex in big_ev.examples}
    assert FidelityEvaluator(big_ev, top_k=8).adopt(small) == 0  # another reference: nothing taken
    big = FidelityEvaluator(big_ev)
    assert big.adopt(small) == len(shared) > 0
    assert all(big.prefixes[k] is small.prefixes[k] for k in shared)
    captures: list[str] = []
    capture = big.keep_all.capture_prefix
    big.keep_all.capture_prefix = lambda ids: captures.append("x") or capture(ids)  # type: ignore[method-assign]
    engines = _frozen_engines(model, tokenizer, {1: {1: 50}, 2: {2: 70}})
    got = big.score_together(engines, kl=True)
    assert len(captures) == len(big_ev.examples) - len(shared)
    fresh = FidelityEvaluator(Evaluator(model, tokenizer, config(3), tmp_path / "fresh", progress=False))
    want = fresh.score_together(engines, kl=True)
    for n in engines:
        assert [r.prediction for r in got[n][0]] == [r.prediction for r in want[n][0]]
        assert [d.kl for d in got[n][1]] == pytest.approx([d.kl for d in want[n][1]], abs=1e-6)


def test_baseline_and_reference_from_one_prefill_equal_those_computed_apart(
    tiny_folder: Path, tmp_path: Path
) -> None:
    """references() on examples with no baseline yet computes both from one unpruned prefill per
    example; the answers, the cached baseline and the reference are those of computing them apart."""
    model, tokenizer = load_model(str(tiny_folder))
    cfg = EvalSettings(model=str(tiny_folder), task="qa", n_examples=2, max_prompt_tokens=80,
                       max_new_tokens=6, data_dir=longbench_dir())  # fmt: skip
    apart = Evaluator(model, tokenizer, cfg, tmp_path / "apart", progress=False)
    base = apart.baseline()  # first the baseline (generate), then the references forced along it
    refs_apart = FidelityEvaluator(apart, gold=True).references()
    together = Evaluator(model, tokenizer, cfg, tmp_path / "together", progress=False)
    fid = FidelityEvaluator(together, gold=True)
    captures, full_prefills = _count_unpruned_prefills(fid)
    refs = fid.references()
    # one unpruned prefill per example: its prefix; the answer and its reference resume from it
    assert len(captures) == len(together.examples) > 1 and not full_prefills
    for ex in together.examples:
        got, want = together.cache.entries[ex.key], base[ex.key]
        assert (got.prediction, got.score, got.token_ids) == (want.prediction, want.score, want.token_ids)
        for name in ("answer_ids", "topk_ids", "topk_logp", "gold_ids", "gold_logp"):
            assert torch.equal(getattr(refs[ex.key], name), getattr(refs_apart[ex.key], name)), name
    # a keep-all trial reproduces the reference exactly
    keep = LazyLLM(model, Schedule.keep_all("x", model.config.num_hidden_layers), strict_model_name=False)
    assert all(d.kl == 0.0 and d.top1 == 1.0 for d in fid.evaluate(keep)[0])


def test_keep_all_forced_logits_match_a_transformers_forward() -> None:
    """Teacher forcing along an arbitrary (non-greedy) answer: keep-all equals one plain forward pass."""
    model = make_tiny("llama")
    keep = LazyLLM(model, Schedule.keep_all("tiny", model.config.num_hidden_layers), strict_model_name=False)
    ids = prompt(30, seed=4)
    answer = [5, 17, 5, 90, 1]
    forced = forced_logits(keep, ids[0], answer)
    with torch.inference_mode():
        full = model(torch.cat([ids, torch.tensor([answer[:-1]])], dim=1)).logits[0, ids.shape[1] - 1 :]
    torch.testing.assert_close(forced, full.float(), atol=1e-4, rtol=1e-4)


def test_drift_of_keep_all_is_zero_and_of_pruning_positive() -> None:
    model = make_tiny("llama")
    layers = model.config.num_hidden_layers
    keep = LazyLLM(model, Schedule.keep_all("tiny", layers), strict_model_name=False)
    ids = prompt(48, seed=2)
    answer = keep.generate(ids, max_new_tokens=8, eos_token_id=[]).token_ids
    ref = reference_from_logits(answer, forced_logits(keep, ids[0], answer), top_k=5)
    kl, top1 = drift(ref, forced_logits(keep, ids[0], answer))
    assert kl == pytest.approx(0.0, abs=1e-6) and top1 == 1.0
    hard = LazyLLM(model, Schedule.from_layers("tiny", layers, {0: 90}), strict_model_name=False)
    kl_hard, _ = drift(ref, forced_logits(hard, ids[0], answer))
    assert kl_hard > 1e-5  # a random tiny model is near-uniform: small, but far above float noise
    # the coarsened KL never exceeds the full KL
    p = torch.log_softmax(forced_logits(keep, ids[0], answer), -1).double()
    q = torch.log_softmax(forced_logits(hard, ids[0], answer), -1).double()
    full = float((p.exp() * (p - q)).sum(-1).mean())
    assert 0 < kl_hard <= full + 1e-9


def test_drift_hand_computed() -> None:
    """Two-token vocabulary plus a third, top_k=1: KL of the coarsened distributions by hand."""
    p = torch.tensor([[0.7, 0.2, 0.1]])
    q = torch.tensor([[0.5, 0.3, 0.2]])
    ref = reference_from_logits([0], p.log(), top_k=1)
    kl, top1 = drift(ref, q.log())
    expected = 0.7 * torch.log(torch.tensor(0.7 / 0.5)) + 0.3 * torch.log(torch.tensor(0.3 / 0.5))
    assert kl == pytest.approx(float(expected), rel=1e-6) and top1 == 1.0
    _, top1_other = drift(ref, torch.tensor([[0.1, 0.8, 0.1]]).log())
    assert top1_other == 0.0


def test_study_fidelity_cached_as_safetensors(tiny_folder: Path, tmp_path: Path) -> None:
    model, tokenizer = load_model(str(tiny_folder))
    config = EvalSettings(
        model=str(tiny_folder), task="hotpotqa,trec", n_examples=1, max_prompt_tokens=96, max_new_tokens=3,
        data_dir=longbench_dir(),
    )  # fmt: skip
    ev = Evaluator(model, tokenizer, config, tmp_path / "cache", progress=False)
    fid = FidelityEvaluator(ev, top_k=4, gold=True)
    layers = model.config.num_hidden_layers
    keep = LazyLLM(model, Schedule.keep_all("x", layers), strict_model_name=False)
    drifts, reason = fid.evaluate(keep)
    assert reason is None and len(drifts) == len(ev.examples) == 2
    for d in drifts:
        assert d.kl == pytest.approx(0.0, abs=1e-6) and d.top1 == 1.0
        assert d.gold_delta == pytest.approx(0.0, abs=1e-6)
    assert fid.cache.path.suffix == ".safetensors" and fid.cache.path.parent == ev.cache.path.parent
    again = ReferenceCache(fid.cache.path, fid.cache.identity)
    assert set(again.entries) == {ex.key for ex in ev.examples}
    for key, ref in again.entries.items():
        assert torch.equal(ref.topk_logp, fid.cache.entries[key].topk_logp)
    pruned = LazyLLM(model, Schedule.from_layers("x", layers, {0: 80}), strict_model_name=False)
    hard, _ = fid.evaluate(pruned)
    assert sum(d.kl for d in hard) > 0
    # a stop rule sees each example's drift and ends the pass early
    stopped, why = fid.evaluate(pruned, should_stop=lambda done: "enough" if len(done) == 1 else None)
    assert why == "enough" and len(stopped) == 1


def test_reference_cache_ignores_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "fidelity-x.safetensors"
    path.write_bytes(b"not safetensors")
    assert ReferenceCache(path).entries == {}


def test_reference_cache_of_another_format_is_recomputed(tmp_path: Path) -> None:
    """v1 references were forced step by step; read beside v2 trials they would give keep-all a
    rounding-sized KL instead of exactly 0, so a file of another format is never trusted."""
    path = tmp_path / "fidelity-x.safetensors"
    ref = reference_from_logits([1, 2], torch.randn(2, 11), top_k=3)
    save_file(ref.tensors("k"), str(path), metadata={"format": "lazyllm-fidelity-v1"})
    assert ReferenceCache(path).entries == {}
    cache = ReferenceCache(path)
    cache.entries["k"] = ref
    cache.save()
    assert set(ReferenceCache(path).entries) == {"k"}
