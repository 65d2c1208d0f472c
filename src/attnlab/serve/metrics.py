"""The server's measurements in Prometheus' text format (GET /metrics), kept by prometheus_client.

Requests by route and status, prompt and generated tokens, the waiting queue's depth, the running
batch's size, and histograms of time to first token (from arrival: queueing + prefill) and of the
latency between consecutive tokens of one sequence. Each server has its own registry.
"""
from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

disable_created_metrics()  # no *_created series: one line per figure

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class ServerMetrics:
    """The counters, gauges and histograms of one server (and the scheduler's report interface:
    queue_depth, batch_size, decode_step, prefilled, first_token, next_token)."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("attnlab_requests", "HTTP requests answered, by route and status code",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("attnlab_prompt_tokens", "prompt tokens prefilled", registry=r)
        self.generated_tokens = Counter("attnlab_generated_tokens", "tokens generated", registry=r)
        self.steps = Counter("attnlab_decode_steps", "batched decoding steps (generated tokens / steps = the "
                             "mean batch)", registry=r)
        self.queue = Gauge("attnlab_queue_depth", "requests waiting for a batch slot", registry=r)
        self.batch = Gauge("attnlab_running_batch_size", "sequences in the last decoding step", registry=r)
        self.ttft = Histogram("attnlab_time_to_first_token_seconds", "arrival to first generated token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("attnlab_inter_token_latency_seconds", "time between consecutive tokens of a "
                             "sequence", buckets=TOKEN_BUCKETS, registry=r)

    def request(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(status)).inc()

    def queue_depth(self, n: int) -> None:
        self.queue.set(n)

    def batch_size(self, n: int) -> None:
        self.batch.set(n)

    def decode_step(self, n: int) -> None:
        """One engine.step of n sequences."""
        self.batch.set(n)
        self.steps.inc()

    def prefilled(self, n: int) -> None:
        self.prompt_tokens.inc(n)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.generated_tokens.inc()

    def next_token(self, seconds: float) -> None:
        self.itl.observe(seconds)
        self.generated_tokens.inc()

    def render(self) -> tuple[bytes, str]:
        """(the exposition text, its content type)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
