"""The serving scheduler: one engine worker thread that decodes concurrent requests as batches.

Requests wait in a bounded queue (:meth:`Scheduler.submit` refuses one when ``max_queue`` are
waiting). The worker **admits at batch boundaries**: when it is idle it takes every waiting request,
up to ``max_batch``, and decodes them as one batch with :func:`lazyllm.batch.generate_batch`
(each prompt pruned by its own schedule's prefill, the decoding steps shared); a request that arrives
while a batch runs waits for that batch to finish, then joins the next one with everything else that
arrived meanwhile. Requests are never admitted into a running decode batch (the batched engine has
no step-level admission), so a short request behind a long batch waits for it: its ``queue_s`` says
how long. A schedule that revives tokens while decoding (``dynamic``, ``budget:N``) cannot share
decoding steps: its requests run one at a time (``generate_batch`` runs each as ``LazyLLM.generate``
would), in the worker's turn, and say ``batch_size`` 1.

Every new token is reported as it is produced (``on_token``); a request whose client has gone
(:meth:`Job.cancel`) leaves its batch at the next token and costs no more compute, and one cancelled
while it waits is never started. The worker owns the model: no other thread runs it, and no lock is
held around a batch (the queue is the only shared structure besides per-job flags).

:class:`Stats` counts what the worker did (tokens generated, batches and their largest size, requests
cancelled), for ``/health``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lazyllm.batch import BatchRequest, OnToken, decodes_frozen, generate_batch
from lazyllm.engine import GenerationResult, LazyLLM
from lazyllm.sampling import Sampling


@dataclass(frozen=True)
class Token:
    """A new token of a job (streaming jobs only)."""

    token_id: int


@dataclass(frozen=True)
class Done:
    """A job's generation, finished.

    Attributes:
        result: the engine's result (``ttft_s`` is the batched prefill's own).
        queue_s: seconds from submission to the start of the job's batch.
        ttft_s: seconds from submission to the job's first token (queueing included).
        batch_size: how many requests its batch decoded together.
    """

    result: GenerationResult
    queue_s: float
    ttft_s: float
    batch_size: int


@dataclass(frozen=True)
class Failed:
    """A job that could not be generated (the engine raised, or the server is stopping)."""

    message: str


Event = Token | Done | Failed


@dataclass(eq=False)
class Job:
    """One request on its way through the worker.

    Attributes:
        engine: the engine of the request's schedule (every job shares one model).
        input_ids: the encoded prompt (chat template already applied where it applies).
        max_tokens: at most this many new tokens.
        stop: stop strings.
        sampling: the decoding strategy (its seed, if any, seeds the request alone).
        emit: called from the worker thread with each :data:`Event`; must not block.
        stream: whether to emit a :class:`Token` per token (else only the end).
    """

    engine: LazyLLM
    input_ids: tuple[int, ...]
    max_tokens: int
    stop: tuple[str, ...]
    sampling: Sampling
    emit: Callable[[Event], None]
    stream: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_token: float | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Stop spending compute on this job (its client has gone): it leaves its batch at its next token."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@dataclass
class Stats:
    """What the worker did since start (written by the worker thread only).

    Attributes:
        generated_tokens: tokens produced, over every request (cancelled ones included).
        batches: batches decoded.
        largest_batch: the most requests one batch decoded together.
        requests: requests finished (answered or cancelled).
        cancelled: requests cancelled by their client (before or while they ran).
        running: requests in the batch being decoded now.
    """

    generated_tokens: int = 0
    batches: int = 0
    largest_batch: int = 0
    requests: int = 0
    cancelled: int = 0
    running: int = 0


class QueueFull(Exception):
    """The queue holds ``max_queue`` waiting requests already."""


class Scheduler:
    """One worker thread batching the queued jobs (see the module docstring).

    Args:
        max_batch: the most requests decoded together.
        max_queue: the most requests waiting (not yet in a batch); :meth:`submit` refuses more.
    """

    def __init__(self, *, max_batch: int, max_queue: int) -> None:
        if max_batch < 1 or max_queue < 1:
            raise ValueError(f"max_batch = {max_batch}, max_queue = {max_queue}: both must be >= 1")
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.stats = Stats()
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._work, name="lazyllm-engine", daemon=True)
        self._stopping = False
        self._running: Sequence[Job] = ()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Cancel the running batch's jobs (they end at their next token), fail what waits, and end
        the worker."""
        self._stopping = True
        for job in self._running:
            job.cancel()
        while True:
            try:
                waiting = self._queue.get_nowait()
            except queue.Empty:
                break
            if waiting is not None:
                waiting.emit(Failed("the server is shutting down"))
        self._queue.put(None)
        self._thread.join(timeout)

    @property
    def waiting(self) -> int:
        """Jobs waiting for a batch."""
        return self._queue.qsize()

    def submit(self, job: Job) -> None:
        """Queue ``job``; raises :class:`QueueFull` when ``max_queue`` jobs wait already."""
        if self._stopping:
            raise QueueFull("the server is shutting down")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"{self.max_queue} requests are waiting already") from None

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            while len(jobs) < self.max_batch:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:  # stop: finish this batch first
                    self._queue.put(None)
                    break
                jobs.append(job)
            live = [j for j in jobs if not j.cancelled]
            self.stats.cancelled += len(jobs) - len(live)
            self.stats.requests += len(jobs) - len(live)
            if live:
                self._run(live)

    def _run(self, jobs: Sequence[Job]) -> None:
        """Decode ``jobs``: those whose schedules decode frozen as one batch, the others one by one."""
        together = [j for j in jobs if decodes_frozen(j.engine)]
        if together:
            self._run_batch(together)
        for job in jobs:
            if not decodes_frozen(job.engine):
                self._run_batch([job])  # generate_batch runs it as LazyLLM.generate would

    def _run_batch(self, jobs: Sequence[Job]) -> None:
        """Decode ``jobs`` as one batch, reporting tokens as they come."""
        started = time.perf_counter()
        for job in jobs:
            job.started = started
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(jobs))
        self.stats.running = len(jobs)
        self._running = jobs

        def on_token(i: int, token_id: int) -> bool:
            job = jobs[i]
            if job.first_token is None:
                job.first_token = time.perf_counter()
            self.stats.generated_tokens += 1
            if job.stream:
                job.emit(Token(token_id))
            return not job.cancelled

        try:
            results = _decode_together(jobs, on_token)
        except Exception as exc:  # a bug or a device error: every job of the batch is answered with it
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            for job in jobs:
                job.emit(Failed(f"generation failed: {message}"))
            return
        finally:
            self.stats.running = 0
            self._running = ()
            self.stats.requests += len(jobs)
        for job, result in zip(jobs, results, strict=True):
            if job.cancelled or result is None:
                self.stats.cancelled += 1
                continue
            first = job.first_token if job.first_token is not None else time.perf_counter()
            job.emit(Done(result, started - job.submitted, first - job.submitted, len(jobs)))


def _decode_together(jobs: Sequence[Job], on_token: OnToken) -> list[GenerationResult]:
    """One batch of :func:`~lazyllm.batch.generate_batch` (every job's schedule decodes frozen)."""
    requests = [
        BatchRequest(
            engine=job.engine,
            input_ids=job.input_ids,
            max_new_tokens=job.max_tokens,
            stop_strings=job.stop,
            sampling=job.sampling,
            seed=job.sampling.seed,
        )
        for job in jobs
    ]
    return list(generate_batch(requests, batch_size=len(jobs), on_token=on_token))
