"""The server's request queue: one engine worker thread that decodes the requests as one running
batch, admitting new ones at every decoding step (continuous batching).

Requests wait in a bounded FIFO queue (:meth:`RequestQueue.submit` refuses one with
:class:`QueueFull` when ``max_queue`` are waiting, with :class:`ShuttingDown` once the server stops).
Before each decoding step the worker admits waiting requests, oldest first, while fewer than
``max_batch`` decode: it prefills them (those of one schedule as one padded batch), hands out their
first tokens, and they join the running batch (:class:`lazyllm.batch.RunningBatch`); a request that
arrives while a long one decodes starts at the next step instead of waiting for it to end. A request
that stops (EOS, a stop string, its ``max_tokens``) leaves the batch at once. Each request gets the
tokens it gets alone, whatever joined or left around it.

A schedule that revives tokens while decoding (``dynamic``, ``budget:N``) cannot share decoding
steps: such a request runs alone once it is first in line and the batch is empty (nothing is admitted
past it meanwhile, so it is not starved), and says ``batch_size`` 1.

**Failures are per request**: a request whose prompt, sampling or logits fail (see
:class:`~lazyllm.batch.RunningBatch`) gets :class:`Failed` alone; only an error of the shared decoding
step fails the requests decoding with it. **Cancelling** (:meth:`Job.cancel`, the client has gone)
takes a waiting request out of the queue at once (its place is free for the next one) and a running
one out of the batch at its next token. **Stopping** answers every waiting and running request with
:class:`Failed` (503) and ends the worker after its current step.

The worker owns the model: no other thread runs it. The queue (a deque under one condition
variable) and per-job flags are the only shared state; no lock is held while the model runs.
:class:`Stats` counts what the worker did, for ``/health`` and ``/metrics``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from lazyllm.batch import CANCELLED, BatchRequest, Finished, RunningBatch, decodes_frozen, generate_batch
from lazyllm.engine import LazyLLM
from lazyllm.results import GenerationResult
from lazyllm.sampling import Sampling

log = logging.getLogger("lazyllm.serve")

SHUTTING_DOWN = "the server is shutting down; retry on another replica or later"


@dataclass(frozen=True)
class Token:
    """A new token of a job (streaming jobs only)."""

    token_id: int


@dataclass(frozen=True)
class Done:
    """A job's generation, finished.

    Attributes:
        result: the engine's result (``ttft_s`` is the job's own prefill's).
        queue_s: seconds from submission to the job's admission into the batch.
        ttft_s: seconds from submission to the job's first token (queueing included).
        batch_size: the most requests decoding together while the job ran.
    """

    result: GenerationResult
    queue_s: float
    ttft_s: float
    batch_size: int


@dataclass(frozen=True)
class Failed:
    """A job that could not be generated: its own error (500), or the server stopping (503)."""

    message: str
    status: int = 500


Event = Token | Done | Failed


class QueueObserver(Protocol):
    """What the worker reports as it goes (``/metrics``); every method is called on the worker thread
    and must not block."""

    def step(self, batch_size: int) -> None:
        """A decoding step of ``batch_size`` requests."""

    def first_token(self, seconds: float) -> None:
        """A request's first token, ``seconds`` after its submission."""

    def token_gap(self, seconds: float) -> None:
        """A request's next token, ``seconds`` after its previous one."""

    def done(self, done: Done) -> None:
        """A request answered."""


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
        ignore_eos: decode on past EOS tokens, up to ``max_tokens``.
    """

    engine: LazyLLM
    input_ids: tuple[int, ...]
    max_tokens: int
    stop: tuple[str, ...]
    sampling: Sampling
    emit: Callable[[Event], None]
    stream: bool = False
    ignore_eos: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    batch_size: int = 1
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _on_cancel: Callable[[Job], None] | None = None

    def cancel(self) -> None:
        """Stop spending compute on this job (its client has gone): out of the queue at once if it
        waits, out of the batch at its next token if it runs."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            if self._on_cancel is not None:
                self._on_cancel(self)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def request(self) -> BatchRequest:
        """The job as the batch takes it."""
        return BatchRequest(
            engine=self.engine, input_ids=self.input_ids, max_new_tokens=self.max_tokens,
            stop_strings=self.stop, sampling=self.sampling, seed=self.sampling.seed,
            eos_token_id=() if self.ignore_eos else None,
        )  # fmt: skip


@dataclass
class Stats:
    """What the worker did since start.

    Attributes:
        generated_tokens: tokens produced, over every request (cancelled ones included).
        batches: admissions (requests prefilled together and joined to the running batch).
        steps: decoding steps of the running batch.
        largest_batch: the most requests decoding together.
        requests: requests finished (answered, failed or cancelled).
        cancelled: requests cancelled by their client (before or while they ran).
        failed: requests answered with an error.
        running: requests decoding now.
    """

    generated_tokens: int = 0
    batches: int = 0
    steps: int = 0
    largest_batch: int = 0
    requests: int = 0
    cancelled: int = 0
    failed: int = 0
    running: int = 0


class QueueFull(Exception):
    """The queue holds ``max_queue`` waiting requests already."""


class ShuttingDown(Exception):
    """The server is stopping and takes no more requests."""


class RequestQueue:
    """The queue and its worker thread (see the module docstring).

    Args:
        max_batch: the most requests decoding together.
        max_queue: the most requests waiting (not yet admitted); :meth:`submit` refuses more.
        observer: told of every step and token (``/metrics``); None: nobody.
    """

    def __init__(self, *, max_batch: int, max_queue: int, observer: QueueObserver | None = None) -> None:
        if max_batch < 1 or max_queue < 1:
            raise ValueError(f"max_batch = {max_batch}, max_queue = {max_queue}: both must be >= 1")
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.observer = observer
        self.stats = Stats()
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._jobs: dict[int, Job] = {}  # running, by key (worker thread only)
        self._keys = itertools.count()
        self._thread = threading.Thread(target=self._work, name="lazyllm-engine", daemon=True)
        self._draining = False  # no more requests
        self._stopping = False  # the worker ends

    # --- the event loop's side ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker (once; a second call does nothing)."""
        if self._thread.ident is None:
            self._thread.start()

    def drain(self) -> None:
        """Take no more requests and answer every waiting job with :class:`Failed` (503); the running
        ones decode on (the first half of a graceful shutdown)."""
        with self._cond:
            self._draining = True
            waiting, self._waiting = list(self._waiting), deque()
            self.stats.requests += len(waiting)
            self.stats.failed += len(waiting)
            self._cond.notify_all()
        for job in waiting:
            job.emit(Failed(SHUTTING_DOWN, status=503))

    def stop(self, timeout: float | None = None) -> None:
        """:meth:`drain`, then end the worker after its current step (its running jobs get
        :class:`Failed`, 503) and wait for it up to ``timeout`` seconds."""
        self.drain()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the worker runs and takes requests (False once draining, or if it died)."""
        return self._thread.is_alive() and not self._draining

    @property
    def stopping(self) -> bool:
        """Whether the queue takes no more requests (draining or stopped)."""
        return self._draining

    @property
    def waiting(self) -> int:
        """Jobs waiting to be admitted."""
        return len(self._waiting)

    def submit(self, job: Job) -> None:
        """Queue ``job`` (also before :meth:`start`); :class:`QueueFull` when ``max_queue`` jobs wait
        already, :class:`ShuttingDown` once stopping or if the worker died."""
        with self._cond:
            if self._draining or (self._thread.ident is not None and not self._thread.is_alive()):
                raise ShuttingDown(SHUTTING_DOWN)  # stopping, or the worker died
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are waiting already")
            job._on_cancel = self._withdraw
            self._waiting.append(job)
            self._cond.notify()

    def _withdraw(self, job: Job) -> None:
        """A cancelled job leaves the queue at once if it still waits."""
        with self._cond:
            try:
                self._waiting.remove(job)
            except ValueError:
                return  # running (it leaves at its next token) or finished
            self.stats.cancelled += 1
            self.stats.requests += 1

    # --- the worker -----------------------------------------------------------------------------------
    def _work(self) -> None:
        batch = RunningBatch(on_token=self._on_token)
        try:
            while True:
                with self._cond:
                    while not self._waiting and not batch.size and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
                        return
                    admitted = self._admit(batch.size)
                if admitted and not decodes_frozen(admitted[0].engine):
                    self._run_alone(admitted[0])
                    continue
                if admitted:
                    self._join(batch, admitted)
                if batch.size:
                    self._step(batch)
        except Exception:  # a bug of the worker itself: say so; /health then answers 503
            log.exception("the engine worker failed; the server answers 503 from now on")
        finally:
            self._fail_all(batch, SHUTTING_DOWN if self._stopping else "the engine worker failed")

    def _admit(self, running: int) -> list[Job]:
        """Waiting jobs to start now, oldest first, up to ``max_batch`` decoding (under the lock). A
        job whose schedule revives tokens starts alone once it is first and the batch is empty."""
        admitted: list[Job] = []
        while self._waiting and running + len(admitted) < self.max_batch:
            head = self._waiting[0]
            if not decodes_frozen(head.engine):
                if running == 0 and not admitted:
                    admitted.append(self._waiting.popleft())
                break  # nothing is admitted past it
            admitted.append(self._waiting.popleft())
        return admitted

    def _join(self, batch: RunningBatch, jobs: list[Job]) -> None:
        started = time.perf_counter()
        pairs = []
        for job in jobs:
            job.started = started
            key = next(self._keys)
            self._jobs[key] = job
            pairs.append((key, job.request()))
        self.stats.batches += 1
        for finished in batch.add(pairs):
            self._finish(finished)
        self._sizes(batch.size)

    def _sizes(self, size: int) -> None:
        self.stats.running = size
        self.stats.largest_batch = max(self.stats.largest_batch, size)
        for job in self._jobs.values():
            job.batch_size = max(job.batch_size, size)

    def _step(self, batch: RunningBatch) -> None:
        if self.observer is not None:
            self.observer.step(batch.size)
        self.stats.steps += 1
        try:
            ended = batch.step()
        except Exception as exc:  # the shared step: every row decoding with it fails
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            log.error("a decoding step failed (%s): its %d requests fail", message, batch.size)
            for key in batch.clear():
                self._finish(Finished(key, None, f"{type(exc).__name__}: {message}"))
            ended = []
        for finished in ended:
            self._finish(finished)
        self.stats.running = batch.size

    def _run_alone(self, job: Job) -> None:
        """A job whose schedule revives tokens: decoded alone, as ``LazyLLM.generate`` would."""
        job.started = time.perf_counter()
        key = next(self._keys)
        self._jobs[key] = job
        self.stats.batches += 1
        self._sizes(1)
        try:
            (result,) = generate_batch([job.request()], on_token=lambda _i, t: self._on_token(key, t))
            finished = Finished(key, result)
        except Exception as exc:
            message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            finished = Finished(key, None, f"{type(exc).__name__}: {message}")
        self._finish(finished)
        self.stats.running = 0

    def _on_token(self, key: int, token_id: int) -> bool:
        job = self._jobs[key]
        now = time.perf_counter()
        if self.observer is not None:
            if job.last_token is None:
                self.observer.first_token(now - job.submitted)
            else:
                self.observer.token_gap(now - job.last_token)
        if job.first_token is None:
            job.first_token = now
        job.last_token = now
        self.stats.generated_tokens += 1
        if job.stream:
            job.emit(Token(token_id))
        return not job.cancelled

    def _finish(self, finished: Finished) -> None:
        """Answer a job that left the batch."""
        job = self._jobs.pop(finished.key)
        with self._cond:
            self.stats.requests += 1
            if finished.result is None:
                self.stats.failed += 1
            elif job.cancelled or finished.result.finish_reason == CANCELLED:
                self.stats.cancelled += 1
        if finished.result is None:
            job.emit(Failed(f"generation failed: {finished.error}"))
        elif not (job.cancelled or finished.result.finish_reason == CANCELLED):
            assert job.started is not None
            first = job.first_token if job.first_token is not None else time.perf_counter()
            done = Done(finished.result, job.started - job.submitted, first - job.submitted, job.batch_size)
            if self.observer is not None:
                self.observer.done(done)
            job.emit(done)

    def _fail_all(self, batch: RunningBatch, message: str) -> None:
        """Answer every running job with :class:`Failed` (503) as the worker ends."""
        batch.clear()
        jobs, self._jobs = list(self._jobs.values()), {}
        with self._cond:
            self.stats.requests += len(jobs)
            self.stats.failed += len(jobs)
            self.stats.running = 0
        for job in jobs:
            job.emit(Failed(message, status=503))


Scheduler = RequestQueue
"""The queue's name before 0.2 (``lazyllm.scheduler.Scheduler``); kept for one release."""
