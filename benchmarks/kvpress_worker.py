"""The kvpress side of ``benchmarks/kvpress_table.py``, run by ``.venv-kvpress/bin/python`` (``make kvpress-setup``).

    .venv-kvpress/bin/python benchmarks/kvpress_worker.py REQUEST.json   # JSON lines on stdout

kvpress 0.5.5 pins ``transformers<5.3``, so it lives in its own venv and this worker runs there as a
subprocess of the table. It imports torch, transformers, kvpress (only when a press is asked for),
and from this repository only :mod:`lazyllm.text` (the stop rule) and :mod:`tuner.statistics.speed` (the
timing statistic), both of which import cleanly under that ``transformers``; the table sets
``PYTHONPATH`` to the repository root.

Every prompt comes as token ids already split into a context and a question (the table splits them);
a press runs through kvpress's own press API, untouched, doing what kvpress's
``KVPressTextGenerationPipeline._forward`` does with ids instead of text: ``with press(model):
model.model(context_ids, past_key_values=cache)`` (the context compressed), then the question
uncompressed at positions continuing the *uncompressed* context, then greedy decoding (the pipeline's
own tokenizer call would re-encode the text, and the same prompt ids for every method are the point).
Method ``unpruned`` runs the same route without a press: the venv's own unpruned model, the control.

Request (JSON): ``model`` (checkpoint folder), ``dtype``, ``threads``, ``top_k``, ``eos_ids``,
``methods`` (``[{"name", "press" (a kvpress class name or null), "compression_ratio"}]``),
``examples`` (``[{"key", "context_ids", "question_ids", "answer_ids", "max_new_tokens",
"stop_strings", "methods"}]``: ``answer_ids`` is the main venv's unpruned greedy answer, teacher-forced
for the KL; ``methods`` the names still to do) and ``timing`` (null or ``{"key", "context_ids",
"question_ids", "rounds", "clock", "methods"}``).

Output, one JSON object a line, flushed as each is done: ``{"kind": "versions", ...}`` first, then per
(method, example) ``{"kind": "example", "method", "example", "token_ids", "kv_bytes", "kv_tokens",
"kl", "top1", "seconds"}`` and per timed method ``{"kind": "speed", "method", "example", "speed"}``
(:meth:`tuner.statistics.speed.SpeedMeasurement.to_dict`). ``kv_bytes``: the keys and values the cache
holds after the prefill (compressed context plus question), every layer; ``kv_tokens``: per layer.
``kl``/``top1``: :func:`drift` of the press's teacher-forced logits against this venv's unpruned ones.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

TOP_K = 64


def drift(reference: torch.Tensor, logits: torch.Tensor, top_k: int = TOP_K) -> tuple[float, float]:
    """``(mean KL(P || Q), top-1 agreement)`` of logits ``[T, vocab]`` against reference logits: the
    fidelity's own formula (:func:`tuner.evaluation.kl.topk_kl`, which imports torch only) on the
    reference's top-``k`` tokens."""
    from tuner.evaluation.kl import topk_kl

    if logits.shape != reference.shape:
        raise ValueError(f"logits {tuple(logits.shape)} against a reference of {tuple(reference.shape)}")
    logp = torch.log_softmax(reference.float(), dim=-1)
    top = torch.topk(logp, min(top_k, logp.shape[-1]), dim=-1)
    return topk_kl(top.values, top.indices, logits)


def cache_size(cache: Any) -> tuple[int, list[int]]:
    """Bytes of keys and values a transformers cache holds, and the tokens per layer."""
    total, tokens = 0, []
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        total += keys.numel() * keys.element_size() + values.numel() * values.element_size()
        tokens.append(int(keys.shape[-2]))
    return total, tokens


def make_press(name: str | None, ratio: float | None) -> Any:
    """A kvpress press by class name (None: no press), at ``compression_ratio``."""
    if name is None:
        return None
    import kvpress

    cls = getattr(kvpress, name, None)
    if cls is None:
        raise SystemExit(f"kvpress {importlib.metadata.version('kvpress')} has no press {name!r}")
    return cls(compression_ratio=ratio)


def _pressed(press: Any, model: Any) -> Any:
    return press(model) if press is not None else contextlib.nullcontext()


def context_cache(model: Any, context: torch.Tensor, press: Any) -> Any:
    """The pipeline's context prefill: ``model.model`` (no head) on the context under the press."""
    from transformers import DynamicCache

    cache = DynamicCache()
    with _pressed(press, model):
        model.model(input_ids=context[None], past_key_values=cache)
    return cache


def extend(model: Any, cache: Any, start: int, ids: torch.Tensor, last: bool = False) -> torch.Tensor:
    """``ids`` after the cached context, at positions ``start..`` (the pipeline's: after the
    *uncompressed* context); returns their logits ``[len(ids), vocab]`` (``last``: the last row only)."""
    positions = torch.arange(start, start + ids.shape[0])[None]
    keep = 1 if last else 0
    out = model(input_ids=ids[None], past_key_values=cache, position_ids=positions, logits_to_keep=keep)
    return out.logits[0]


def answer(
    model: Any, cache: Any, context_tokens: int, question: torch.Tensor, max_new_tokens: int, stop: Any
) -> tuple[list[int], int, list[int]]:
    """Greedy answer ids after the (pressed) context ``cache``: the question, then the pipeline's
    decoding, stopped by ``stop`` (EOS or a stop string); and the cache's bytes and tokens per layer
    after the prefill (context and question)."""
    logits = extend(model, cache, context_tokens, question, last=True)
    kv_bytes, kv_tokens = cache_size(cache)
    generated = [int(logits[-1].argmax())]
    position = context_tokens + question.shape[0]
    while len(generated) < max_new_tokens and stop.check(generated) is None:
        step = extend(model, cache, position, torch.tensor([generated[-1]]), last=True)
        generated.append(int(step[-1].argmax()))
        position += 1
    return generated, kv_bytes, kv_tokens


def forced(
    model: Any, cache: Any, context_tokens: int, question: torch.Tensor, answer_ids: Sequence[int]
) -> torch.Tensor:
    """Next-token logits ``[T, vocab]`` along ``answer_ids`` after the (pressed) context ``cache`` (a
    copy is extended, the cache is left as it was): the question and every answer token but the last
    teacher-forced; row 0 scores ``answer_ids[0]``."""
    tail = torch.cat([question, torch.tensor(list(answer_ids[:-1]), dtype=torch.long)])
    logits = extend(model, copy.deepcopy(cache), context_tokens, tail)
    return logits[question.shape[0] - 1 :].float()


def ttft_call(model: Any, context: torch.Tensor, question: torch.Tensor, press: Any) -> Callable[[], float]:
    """One TTFT, returning its wall seconds: without a press the unpruned prefill of the whole prompt
    in one forward, with one the pipeline's prefill (context compressed, then the question); both end
    with the first token chosen."""
    from transformers import DynamicCache

    whole = torch.cat([context, question])[None]

    def run() -> float:
        start = time.perf_counter()
        if press is None:
            logits = model(input_ids=whole, past_key_values=DynamicCache(), logits_to_keep=1).logits
        else:
            cache = DynamicCache()
            with press(model):
                model.model(input_ids=context[None], past_key_values=cache)
            n = context.shape[0]
            positions = torch.arange(n, n + question.shape[0])[None]
            logits = model(
                input_ids=question[None], past_key_values=cache, position_ids=positions, logits_to_keep=1
            ).logits
        int(logits[0, -1].argmax())
        return time.perf_counter() - start

    return run


def emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


@torch.inference_mode()
def run(request: dict[str, Any]) -> None:
    import transformers

    from lazyllm.text import StopCriteria
    from tuner.statistics.speed import clock_timer, measure_speedup

    torch.set_num_threads(int(request.get("threads", 1)))
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "kvpress": None}
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        versions["kvpress"] = importlib.metadata.version("kvpress")
    emit({"kind": "versions", **versions})
    tokenizer = transformers.AutoTokenizer.from_pretrained(request["model"], local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        request["model"], dtype=getattr(torch, request["dtype"]), local_files_only=True
    ).eval()
    methods = {m["name"]: m for m in request["methods"]}
    presses = {name: make_press(m["press"], m["compression_ratio"]) for name, m in methods.items()}
    timing = request.get("timing")
    if timing:
        context = torch.tensor(timing["context_ids"], dtype=torch.long)
        question = torch.tensor(timing["question_ids"], dtype=torch.long)
        base = clock_timer(ttft_call(model, context, question, None), timing["clock"])
        for name in timing["methods"]:
            timer = clock_timer(ttft_call(model, context, question, presses[name]), timing["clock"])
            speed = measure_speedup(base, timer, 1.0, rounds=int(timing["rounds"]), clock=timing["clock"])
            emit({"kind": "speed", "method": name, "example": timing["key"], "speed": speed.to_dict()})
    eos = [int(i) for i in request["eos_ids"]]
    for ex in request["examples"]:
        context = torch.tensor(ex["context_ids"], dtype=torch.long)
        question = torch.tensor(ex["question_ids"], dtype=torch.long)
        stop = StopCriteria(frozenset(eos), tuple(ex["stop_strings"]), tokenizer)
        n = context.shape[0]
        unpruned = context_cache(model, context, None)
        reference = forced(model, unpruned, n, question, ex["answer_ids"])
        for name in ex["methods"]:
            start = time.perf_counter()
            press = presses[name]
            # one context prefill per press: the KL's pass extends a copy, the answer the cache itself
            cache = copy.deepcopy(unpruned) if press is None else context_cache(model, context, press)
            kl, top1 = drift(reference, forced(model, cache, n, question, ex["answer_ids"]))
            ids, kv_bytes, kv_tokens = answer(model, cache, n, question, int(ex["max_new_tokens"]), stop)
            emit({
                "kind": "example", "method": name, "example": ex["key"], "token_ids": ids,
                "kv_bytes": kv_bytes, "kv_tokens": kv_tokens, "kl": kl, "top1": top1,
                "seconds": time.perf_counter() - start,
            })  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: kvpress_worker.py REQUEST.json")
    with open(args[0], encoding="utf-8") as f:
        run(json.load(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
