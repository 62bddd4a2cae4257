"""Thread safety: no process-wide lock across a generation, and the model stays ordinary for others."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from lazyllm.engine import GenerationResult, LazyLLM
from lazyllm.schedule import Schedule
from lazyllm.selectors import AttentionSelector, TokenSelector
from tests.support import prompt

TIMEOUT_S = 20.0


class _Meeting(AttentionSelector):
    """LazyLLM's ranking, but each generation's first ranking waits until every party is mid-generation
    (a barrier) and then until ``release`` is set: proof that the generations run at the same time."""

    def __init__(self, barrier: threading.Barrier, release: threading.Event) -> None:
        self.barrier = barrier
        self.release = release
        self.waited = False

    def begin(self) -> TokenSelector:
        return _Meeting(self.barrier, self.release)

    def rank(self, layer: int, attention: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if not self.waited:
            self.waited = True
            self.barrier.wait()
            if not self.release.wait(TIMEOUT_S):
                raise TimeoutError("the plain-model thread never finished")
        return attention


def test_two_generations_at_once_equal_one_after_the_other(
    model_pair: Callable[[str], tuple[Any, Any]],
) -> None:
    model, _ = model_pair("mistral")  # sliding windows: a plain forward needs its real mask
    schedule = Schedule("tiny-mistral", (0.0, 50.0, 0.0, 40.0, 0.0))
    prompts = [prompt(30, seed=1), prompt(26, seed=2)]
    plain_ids = prompt(24, seed=3)
    with torch.inference_mode():
        plain_expected = model(plain_ids).logits

    def run(engine: LazyLLM, ids: torch.Tensor) -> GenerationResult:
        return engine.generate(ids, max_new_tokens=10, eos_token_id=[], return_logits=True)

    sequential = [run(LazyLLM(model, schedule), ids) for ids in prompts]

    barrier = threading.Barrier(3, timeout=TIMEOUT_S)
    release = threading.Event()
    shared = LazyLLM(model, schedule, selector=_Meeting(barrier, release))  # one engine, two threads
    results: dict[int, GenerationResult] = {}
    errors: list[BaseException] = []
    plain_got: list[torch.Tensor] = []

    def generate(i: int) -> None:
        try:
            results[i] = run(shared, prompts[i])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()

    def plain() -> None:
        try:
            barrier.wait()  # both generations are inside their prefill now, blocked until release
            with torch.inference_mode():
                plain_got.append(model(plain_ids).logits)
        except BaseException as exc:
            errors.append(exc)
        finally:
            release.set()

    threads = [threading.Thread(target=generate, args=(i,), daemon=True) for i in range(2)]
    threads.append(threading.Thread(target=plain, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * TIMEOUT_S)
    assert not errors, errors
    assert len(results) == 2 and len(plain_got) == 1
    for i in range(2):
        assert results[i].token_ids == sequential[i].token_ids
        for ours, alone in zip(results[i].step_logits, sequential[i].step_logits):
            torch.testing.assert_close(ours, alone, atol=1e-5, rtol=0)
    # the thread that used the plain model meanwhile got ordinary (sliding-window, causal) attention
    torch.testing.assert_close(plain_got[0], plain_expected, atol=1e-5, rtol=0)
    assert model.config._attn_implementation == "sdpa"
