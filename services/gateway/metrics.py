"""Prometheus metrics of the gateway, in a registry of their own (one per app)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from services.gateway.responses import usage
from services.gateway.service import Run

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_RESPONSE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
#: Requests kept for the status page's latency and cache figures (``Served``).
RECENT_SERVED = 512


@dataclass(frozen=True, slots=True)
class Served:
    """One finished request as the status page shows it: when it ended (wall clock), its
    latencies in seconds (None where it had no such figure) and its prompt's tokens."""

    ended_at: float
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int


class GatewayMetrics:
    """The gateway's counters and histograms.

    Owns its ``CollectorRegistry``, so several apps in one process (tests) never collide.
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.recent: deque[Served] = deque(maxlen=RECENT_SERVED)
        self.requests = Counter(
            "crescent_gateway_requests",
            "HTTP requests by endpoint and status code",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.response_start = Histogram(
            "crescent_gateway_response_start_seconds",
            "From request arrival to the response's status line, by status code (how fast a "
            "refusal is)",
            ["status"],
            buckets=_RESPONSE_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "crescent_gateway_requests_in_flight",
            "Generation requests being served",
            registry=self.registry,
        )
        self.ttft = Histogram(
            "crescent_gateway_time_to_first_token_seconds",
            "From request arrival to the first output token",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tpot = Histogram(
            "crescent_gateway_time_per_output_token_seconds",
            "Mean time between output tokens of one choice",
            buckets=_TPOT_BUCKETS,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "crescent_gateway_prompt_tokens",
            "Prompt tokens of served requests",
            registry=self.registry,
        )
        self.cached_tokens = Counter(
            "crescent_gateway_cached_prompt_tokens",
            "Prompt tokens found in the KV cache",
            registry=self.registry,
        )
        self.generation_tokens = Counter(
            "crescent_gateway_generation_tokens", "Output tokens sent", registry=self.registry
        )
        self.e2e = Histogram(
            "crescent_gateway_e2e_request_latency_seconds",
            "From request arrival to its last token (a stream's end)",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.cached_by_tier = Counter(
            "crescent_gateway_cached_prompt_tokens_by_tier",
            "Prompt tokens found in the KV cache, by the tier they came from (dram: a pool)",
            ["tier"],
            registry=self.registry,
        )
        self.migrations = Counter(
            "crescent_gateway_request_migrations",
            "Times a request moved to another node mid-way (its node drained or was lost)",
            registry=self.registry,
        )
        self.phase = Histogram(
            "crescent_gateway_request_phase_seconds",
            "Time a request spent in each phase of its path (shared/phases.py), per request; "
            "per-token phases are the request's mean",
            ["phase"],
            buckets=_PHASE_BUCKETS,
            registry=self.registry,
        )

    def observe_run(self, run: Run, phases: Mapping[str, float] | None = None) -> None:
        timing, phases = run.timing, phases or {}
        ttft = None if timing.first_token is None else timing.first_token - timing.start
        if ttft is not None:
            self.ttft.observe(ttft)
        tpots = []
        for index, choice in enumerate(run.choices):
            tpot = timing.time_per_output_token(index, choice.completion_tokens)
            if tpot is not None:
                self.tpot.observe(tpot)
                tpots.append(tpot)
        e2e = time.monotonic() - timing.start + phases.get("parse", 0.0)
        self.e2e.observe(e2e)
        counts = usage(run.request, run.choices)
        details = counts["prompt_tokens_details"]
        self.prompt_tokens.inc(counts["prompt_tokens"])
        self.cached_tokens.inc(details["cached_tokens"])
        for tier, tokens in details["cached_tokens_by_tier"].items():
            self.cached_by_tier.labels(tier).inc(tokens)
        self.generation_tokens.inc(counts["completion_tokens"])
        self.migrations.inc(run.resumes)
        for phase, seconds in phases.items():
            self.phase.labels(phase).observe(seconds)
        tpot = sum(tpots) / len(tpots) if tpots else None
        self.recent.append(
            Served(time.time(), ttft, tpot, e2e, counts["prompt_tokens"], details["cached_tokens"])
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
