"""lazyllm.serving.queue: the request queue and its worker, in process (no HTTP; that is test_serve):
first come first served, a cancelled request's place free at once, a short request admitted beside a
long one, per-request failures, and stopping."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from lazyllm import LazyLLM, Schedule
from lazyllm.sampling import Sampling
from lazyllm.serving.queue import Done, Event, Failed, Job, QueueFull, RequestQueue, ShuttingDown, Token
from tests.support import make_tiny, prompt

WAIT_S = 60.0


@pytest.fixture(scope="module")
def engines() -> tuple[LazyLLM, LazyLLM]:
    model = make_tiny("llama")
    model.generation_config.eos_token_id = None  # no EOS: every request runs to its max_tokens
    name, layers = model.config.name_or_path, model.config.num_hidden_layers
    frozen = Schedule(name, (0.0, 40.0, 0.0, 50.0, 0.0)).with_revival("frozen")
    return LazyLLM(model, frozen), LazyLLM(model, Schedule.keep_all(name, layers))


class Inbox:
    """A job's events, as its HTTP handler would see them; ``delay`` seconds per token slow the worker
    (it calls ``emit``), so that a long request is still running while the test acts."""

    def __init__(self, delay: float = 0.0) -> None:
        self.events: list[Event] = []
        self.ended = threading.Event()
        self.ended_at = 0.0
        self.delay = delay

    def emit(self, event: Event) -> None:
        if isinstance(event, Token) and self.delay:
            time.sleep(self.delay)
        self.events.append(event)
        if not isinstance(event, Token):
            self.ended_at = time.perf_counter()
            self.ended.set()

    @property
    def last(self) -> Event:
        assert self.ended.wait(WAIT_S), "the job never ended"
        return self.events[-1]


LONG = 480  # the tiny model's context is 512 positions


def _job(
    engine: LazyLLM, n: int, max_tokens: int, *, stream: bool = False, seed: int = 0
) -> tuple[Job, Inbox]:
    inbox = Inbox(delay=0.01 if stream and max_tokens == LONG else 0.0)
    ids = tuple(prompt(n, seed=seed)[0].tolist())
    return Job(engine, ids, max_tokens, (), Sampling(), inbox.emit, stream=stream), inbox


@pytest.fixture
def queue() -> Iterator[RequestQueue]:
    q = RequestQueue(max_batch=4, max_queue=4)
    q.start()
    yield q
    q.stop(timeout=WAIT_S)


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.005)


def test_requests_start_in_the_order_they_came(engines: tuple[LazyLLM, LazyLLM]) -> None:
    frozen, keep_all = engines
    q = RequestQueue(max_batch=1, max_queue=8)
    jobs = [_job(frozen if i % 2 else keep_all, 10 + i, 3, seed=i) for i in range(6)]
    for job, _ in jobs:  # all wait before the worker starts
        q.submit(job)
    assert q.waiting == 6
    q.start()
    try:
        for job, inbox in jobs:
            done = inbox.last
            assert isinstance(done, Done) and done.batch_size == 1
            alone = job.engine.generate(torch.tensor(job.input_ids), max_new_tokens=3)
            assert done.result.token_ids == alone.token_ids
        starts = [job.started for job, _ in jobs]
        assert all(a is not None and b is not None and a < b for a, b in itertools.pairwise(starts))
    finally:
        q.stop(timeout=WAIT_S)
    assert q.stats.requests == 6 and q.stats.largest_batch == 1


def test_a_cancelled_request_frees_its_place_at_once(engines: tuple[LazyLLM, LazyLLM]) -> None:
    frozen, _ = engines
    q = RequestQueue(max_batch=1, max_queue=1)
    q.start()
    try:
        running, running_inbox = _job(frozen, 12, LONG, stream=True)
        q.submit(running)
        _until(lambda: running_inbox.events, "the first request runs")
        waiting, waiting_inbox = _job(frozen, 9, 3)
        q.submit(waiting)
        with pytest.raises(QueueFull):
            q.submit(_job(frozen, 9, 3)[0])
        waiting.cancel()  # its client went: its place is free now, not at the next batch boundary
        assert q.waiting == 0
        later, later_inbox = _job(frozen, 11, 3, seed=1)
        q.submit(later)
        running.cancel()  # the running one leaves at its next token, and the slot goes to `later`
        assert isinstance(later_inbox.last, Done)
        assert not waiting_inbox.events and not running_inbox.ended.is_set()  # no answer to the gone
        assert q.stats.cancelled == 2 and q.stats.running == 0
        assert q.stats.generated_tokens < LONG
    finally:
        q.stop(timeout=WAIT_S)


def test_a_short_request_joins_a_long_one_and_finishes_first(
    queue: RequestQueue, engines: tuple[LazyLLM, LazyLLM]
) -> None:
    frozen, keep_all = engines
    long, long_inbox = _job(frozen, 30, LONG, stream=True)
    queue.submit(long)
    _until(lambda: len(long_inbox.events) >= 3, "the long request decodes")
    short, short_inbox = _job(keep_all, 8, 4, seed=3)
    queue.submit(short)
    done = short_inbox.last
    assert isinstance(done, Done) and done.batch_size == 2
    assert not long_inbox.ended.is_set()  # admitted beside it, not after it
    long_done = long_inbox.last
    assert isinstance(long_done, Done) and short_inbox.ended_at < long_inbox.ended_at
    for job, result in ((long, long_done.result), (short, done.result)):
        alone = job.engine.generate(torch.tensor(job.input_ids), max_new_tokens=job.max_tokens)
        assert result.token_ids == alone.token_ids
    tokens = [e.token_id for e in long_inbox.events if isinstance(e, Token)]
    assert tokens == long_done.result.token_ids  # every token streamed, in order


def test_a_failing_request_fails_alone(queue: RequestQueue, engines: tuple[LazyLLM, LazyLLM]) -> None:
    frozen, _ = engines
    fine = [_job(frozen, 10 + i, 6, seed=i) for i in range(2)]
    inbox = Inbox()
    ids = tuple(prompt(14, seed=9)[0].tolist())
    poisoned = Job(frozen, ids, 6, (), Sampling(do_sample=True, temperature=1e-300), inbox.emit)
    for job in (fine[0][0], poisoned, fine[1][0]):
        queue.submit(job)
    failed = inbox.last
    assert isinstance(failed, Failed) and failed.status == 500 and "probability tensor" in failed.message
    for job, box in fine:
        done = box.last
        assert isinstance(done, Done)
        assert (
            done.result.token_ids == frozen.generate(torch.tensor(job.input_ids), max_new_tokens=6).token_ids
        )
    assert queue.stats.failed == 1


def test_stopping_answers_what_waits_and_what_runs_503(engines: tuple[LazyLLM, LazyLLM]) -> None:
    frozen, _ = engines
    q = RequestQueue(max_batch=1, max_queue=4)
    q.start()
    running, running_inbox = _job(frozen, 12, LONG, stream=True)
    q.submit(running)
    _until(lambda: running_inbox.events, "the first request runs")
    waiting, waiting_inbox = _job(frozen, 9, 3)
    q.submit(waiting)
    assert q.alive
    q.drain()  # the first half of a graceful shutdown: the waiting one answered now, nothing new taken
    first = waiting_inbox.last
    assert isinstance(first, Failed) and first.status == 503
    assert not q.alive and q.stopping and not running_inbox.ended.is_set()
    with pytest.raises(ShuttingDown):
        q.submit(_job(frozen, 9, 3)[0])
    q.stop(timeout=WAIT_S)
    last = running_inbox.last
    assert isinstance(last, Failed) and last.status == 503
    assert q.stats.running == 0 and q.stats.failed == 2
