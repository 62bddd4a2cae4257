"""Prometheus metrics of one server (``GET /metrics``, the text format), in a registry of its own so
that several apps in one process (the tests) do not share counters.

======================================== ========= =============================================
metric                                   type      what
======================================== ========= =============================================
``lazyllm_requests_total``               counter   answered requests by ``route`` and ``status``
``lazyllm_queue_waiting``                gauge     requests waiting to be admitted
``lazyllm_requests_running``             gauge     requests decoding now
``lazyllm_batch_size``                   histogram requests per decoding step
``lazyllm_time_to_first_token_seconds``  histogram submission to first token (queueing included)
``lazyllm_inter_token_latency_seconds``  histogram one token to the next of one request
``lazyllm_prompt_computed_fraction``     histogram share of prompt (token, layer) pairs computed
======================================== ========= =============================================
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from lazyllm.serving.queue import Done

__all__ = ["CONTENT_TYPE", "Metrics"]

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_GAPS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The server's metrics; a :class:`~lazyllm.serving.queue.QueueObserver` of its queue.

    Args:
        waiting, running: read the queue's depth and running count when scraped.
    """

    def __init__(self, waiting: Callable[[], float], running: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "lazyllm_requests", "Answered requests, by route and HTTP status", ["route", "status"], registry=r
        )
        Gauge("lazyllm_queue_waiting", "Requests waiting to be admitted", registry=r).set_function(waiting)
        Gauge("lazyllm_requests_running", "Requests decoding now", registry=r).set_function(running)
        self.batch_size = Histogram(
            "lazyllm_batch_size", "Requests per decoding step", buckets=(1, 2, 4, 8, 16, 32, 64), registry=r
        )
        self.ttft = Histogram(
            "lazyllm_time_to_first_token_seconds", "Submission to first token, queueing included",
            buckets=_SECONDS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "lazyllm_inter_token_latency_seconds", "One token to the next of one request",
            buckets=_GAPS, registry=r,
        )  # fmt: skip
        self.computed = Histogram(
            "lazyllm_prompt_computed_fraction", "Share of prompt (token, layer) pairs computed",
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0), registry=r,
        )  # fmt: skip

    # --- QueueObserver ----------------------------------------------------------------------------
    def step(self, batch_size: int) -> None:
        self.batch_size.observe(batch_size)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def token_gap(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def done(self, done: Done) -> None:
        self.computed.observe(done.result.prompt_computed_fraction)

    # --- HTTP -------------------------------------------------------------------------------------
    def answered(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(status)).inc()

    def text(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)
