"""What a running cluster shows of its workload, read from what its gateways expose: the
counters of ``/metrics`` (requests by endpoint and status, prompt, cached and output tokens,
requests served) scraped at both ends of a window, and ``/status`` (the nodes heard from, the
last requests served with their latencies). Pure: the caller fetches the texts.

A request's output length is not in ``/status``; it follows from its latencies, as the
gateway measures TPOT over the tokens after the first: ``1 + (e2e - TTFT) / TPOT``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from crescent.plan.workload import Lengths, Workload

#: The gateway's routes that generate (services/gateway/api.py); their requests are the load.
GENERATION_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
#: Sample names of the gateway's counters (services/gateway/metrics.py) read here.
_SERVED = "crescent_gateway_e2e_request_latency_seconds_count"
_TOKENS = {
    "prompt_tokens": "crescent_gateway_prompt_tokens_total",
    "cached_tokens": "crescent_gateway_cached_prompt_tokens_total",
    "output_tokens": "crescent_gateway_generation_tokens_total",
}


@dataclass(frozen=True, slots=True)
class Counts:
    """A gateway's counters at one scrape: generation requests that arrived (refusals for
    load count, malformed requests do not), requests served and their tokens."""

    arrivals: float = 0.0
    served: float = 0.0
    prompt_tokens: float = 0.0
    cached_tokens: float = 0.0
    output_tokens: float = 0.0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def since(self, before: Counts) -> Counts:
        """What was counted after ``before``; a counter that went back (its gateway started
        again) counts from zero, as Prometheus's ``increase`` does."""
        grown = []
        for f in fields(self):
            now, then = getattr(self, f.name), getattr(before, f.name)
            grown.append(now - then if now >= then else now)
        return Counts(*grown)


def _is_load(labels: Mapping[str, str]) -> bool:
    status = labels.get("status", "")
    refused_for_load = status in ("408", "429") or not status.startswith("4")
    return labels.get("endpoint") in GENERATION_ENDPOINTS and refused_for_load


def counts(text: str) -> Counts:
    """The counters of one scrape of a gateway's ``/metrics``."""
    values: dict[str, float] = {"arrivals": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "crescent_gateway_requests_total" and _is_load(sample.labels):
                values["arrivals"] += sample.value
            elif sample.name == _SERVED:
                values["served"] = sample.value
            for key, name in _TOKENS.items():
                if sample.name == name:
                    values[key] = sample.value
    return Counts(**values)


@dataclass(frozen=True, slots=True)
class Observation:
    """A cluster's workload over one window of ``window_s`` seconds (``counted``: what the
    gateways counted in it), a sample of its last requests' lengths, and the prefill and
    decode nodes heard from at its end."""

    window_s: float
    counted: Counts
    recent: tuple[Lengths, ...]
    prefill_nodes: int
    decode_nodes: int

    @property
    def rate_per_s(self) -> float:
        return self.counted.arrivals / self.window_s if self.window_s > 0 else 0.0

    @property
    def cached_share(self) -> float:
        prompt = self.counted.prompt_tokens
        return min(self.counted.cached_tokens / prompt, 1.0) if prompt else 0.0

    def mean_lengths(self) -> tuple[float, float] | None:
        """Mean prompt and output tokens of the requests served in the window."""
        served = self.counted.served
        if not served:
            return None
        return self.counted.prompt_tokens / served, self.counted.output_tokens / served

    def workload(self, requests: int, seed: int = 0) -> Workload | None:
        """The observed workload to plan for; None when nothing arrived or nothing tells the
        requests' lengths."""
        means = self.mean_lengths()
        mix = self.recent
        if not mix and means is not None:
            mix = (Lengths(max(round(means[0]), 1), max(round(means[1]), 1)),)
        if not mix or self.rate_per_s <= 0:
            return None
        return Workload(self.rate_per_s, mix, self.cached_share, requests, seed)


def recent_lengths(status: Mapping[str, Any]) -> tuple[Lengths, ...]:
    """The lengths of the requests a ``/status`` document lists (those that produced a token)."""
    out = []
    for r in status.get("requests", []):
        if r.get("ttft_ms") is None or r.get("prompt_tokens", 0) < 1:
            continue
        tpot, e2e = r.get("tpot_ms"), r.get("e2e_ms")
        output = 1
        if tpot and e2e is not None:
            output = 1 + max(round((e2e - r["ttft_ms"]) / tpot), 0)
        out.append(Lengths(int(r["prompt_tokens"]), output))
    return tuple(out)


def running(status: Mapping[str, Any]) -> tuple[int, int]:
    """Prefill and decode nodes of a ``/status`` document that are not silent."""
    heard = [n["role"] for n in status.get("nodes", []) if n.get("health") != "silent"]
    return heard.count("prefill"), heard.count("decode")


def observe(
    before: Iterable[str],
    after: Iterable[str],
    window_s: float,
    statuses: Sequence[Mapping[str, Any]],
) -> Observation:
    """The observation from each gateway's ``/metrics`` text at both ends of the window and
    their ``/status`` documents at its end (nodes from the first: every gateway hears all)."""
    counted = Counts()
    for then, now in zip(before, after, strict=True):
        counted = counted + counts(now).since(counts(then))
    recent = tuple(kind for status in statuses for kind in recent_lengths(status))
    prefill, decode = running(statuses[0]) if statuses else (0, 0)
    return Observation(window_s, counted, recent, prefill, decode)
