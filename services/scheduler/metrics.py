"""The scheduler's Prometheus metrics, in a registry of its own.

The share of prompt tokens served from caches is
``rate(crescent_placed_cached_tokens_total[5m]) / rate(crescent_placed_prompt_tokens_total[5m])``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.scheduler.cluster import TIERD, ClusterView
from services.scheduler.policy import Placement, PlacementRequest, Rejection
from services.scheduler.saturation import REFERENCE_PROMPT_TOKENS, Saturation, TypicalPrompt

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)


class SchedulerMetrics:
    """Owns the registry and every metric the scheduler exports, and the typical prompt of
    its recent placements (``typical``, which the saturation gauges price); ``view`` is read
    at scrape, the saturation reading as last set (``saturated``)."""

    def __init__(
        self, view: ClusterView, reference_prompt_tokens: int = REFERENCE_PROMPT_TOKENS
    ) -> None:
        self.typical = TypicalPrompt(reference_prompt_tokens)
        self.registry = CollectorRegistry()
        r = self.registry
        self.placements = Counter("crescent_placements", "requests placed on nodes", registry=r)
        self.local_prefills = Counter(
            "crescent_local_prefills",
            "requests prefilled on their decode node, with no KV hand-off",
            registry=r,
        )
        self.rejections = Counter(
            "crescent_rejections", "requests refused, by cause", ["cause"], registry=r
        )
        self.fallbacks = Counter(
            "crescent_cachemeta_fallbacks",
            "placements made without cachemeta's answer, by reason",
            ["reason"],
            registry=r,
        )
        self.predicted_ttft = Histogram(
            "crescent_predicted_ttft_seconds",
            "predicted time to first token of placed requests",
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "crescent_placed_prompt_tokens", "prompt tokens of placed requests", registry=r
        )
        self.cached_tokens = Counter(
            "crescent_placed_cached_tokens",
            "prompt tokens of placed requests planned to come from a cache (local or pulled)",
            registry=r,
        )
        self.pulled_blocks = Counter(
            "crescent_planned_pull_blocks", "blocks placements told nodes to pull", registry=r
        )
        self.prefetched_blocks = Counter(
            "crescent_prefetch_blocks",
            "blocks tierds were asked to move from S3 to NVMe while their request waits",
            registry=r,
        )
        self.replacements = Counter(
            "crescent_replacements",
            "placements made again: of a request moved off its node (resume), or after the "
            "prefill node offered it refused (offer_refused)",
            ["cause"],
            registry=r,
        )
        self.pending = Gauge(
            "crescent_scheduler_pending_requests",
            "requests this scheduler is placing now (its queue)",
            registry=r,
        )
        r.register(_LiveNodes(view))
        self._saturation = _SaturationGauges()
        r.register(self._saturation)

    def watch_pending(self, pending: Callable[[], float]) -> None:
        """Reads the scheduler's queue depth from ``pending`` at each scrape."""
        self.pending.set_function(pending)

    def saturated(self, reading: Saturation) -> None:
        """The saturation gauges show ``reading`` from now on (until the next one)."""
        self._saturation.reading = reading

    def replaced(self, cause: str) -> None:
        self.replacements.labels(cause).inc()

    def placed(self, placement: Placement, request: PlacementRequest) -> None:
        self.placements.inc()
        if placement.local:
            self.local_prefills.inc()
        self.predicted_ttft.observe(placement.predicted_ttft_s)
        self.prompt_tokens.inc(request.num_prompt_tokens)
        self.cached_tokens.inc(placement.num_cached_tokens)
        self.pulled_blocks.inc(sum(p.num_blocks for p in placement.pulls))
        self.typical.add(request.num_prompt_tokens, placement.num_cached_tokens)

    def prefetched(self, num_blocks: int) -> None:
        self.prefetched_blocks.inc(num_blocks)

    def rejected(self, rejection: Rejection) -> None:
        self.rejections.labels(rejection.cause).inc()

    def fell_back(self, reason: str) -> None:
        self.fallbacks.labels(reason).inc()


class _LiveNodes(Collector):
    """Nodes with a recent heartbeat, by role, computed at scrape time."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        live = GaugeMetricFamily(
            "crescent_live_nodes", "nodes with a recent heartbeat", labels=["role"]
        )
        now = time.monotonic()
        for role in ("prefill", "decode", TIERD):
            live.add_metric([role], len(self.view.live(role, now)))
        yield live


class _SaturationGauges(Collector):
    """The last saturation reading, exported as set: a node's ratio to its role's objective
    and each role's figure (``saturation.py``). Nodes gone since are left out with it."""

    def __init__(self) -> None:
        self.reading = Saturation()

    def collect(self) -> Iterator[Metric]:
        reading = self.reading  # one reading per scrape, whatever the loop sets meanwhile
        nodes = GaugeMetricFamily(
            "crescent_saturation",
            "a node's predicted TTFT (prefill) or recent time between tokens (decode) over "
            "its role's objective: 1 is at the objective",
            labels=["role", "node"],
        )
        for node_id, (role, ratio) in sorted(reading.nodes.items()):
            nodes.add_metric([role, node_id], ratio)
        yield nodes
        roles = GaugeMetricFamily(
            "crescent_role_saturation",
            "the mean saturation of a role's nodes that take work: the figure to scale it on",
            labels=["role"],
        )
        for role, figure in sorted(reading.roles.items()):
            roles.add_metric([role], figure)
        yield roles
