"""kvindex's Prometheus view, read at scrape time: frames by outcome, resend requests, and
the publishers and blocks the index holds (and those it dropped for its cap)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.kvindex.handlers import KvEventHandlers
from services.kvindex.index import KvIndex


class KvIndexMetrics(Collector):
    """Reads the index and the handlers' tallies; owns nothing else."""

    def __init__(self, index: KvIndex, handlers: KvEventHandlers) -> None:
        self.index = index
        self.handlers = handlers

    def collect(self) -> Iterator[Metric]:
        frames = CounterMetricFamily(
            "crescent_kvindex_frames", "KV event frames received, by outcome", labels=["outcome"]
        )
        for outcome, count in sorted(self.handlers.frames.items()):
            frames.add_metric([outcome], count)
        yield frames
        yield CounterMetricFamily(
            "crescent_kvindex_resyncs_asked",
            "requests to a publisher to resend its KV events",
            value=self.handlers.resyncs_asked,
        )
        views = self.index.publishers
        yield GaugeMetricFamily("crescent_kvindex_publishers", "publishers known", len(views))
        blocks = GaugeMetricFamily(
            "crescent_kvindex_blocks", "blocks indexed, by tier", labels=["tier"]
        )
        trimmed = GaugeMetricFamily(
            "crescent_kvindex_trimmed_blocks",
            "blocks of the current views dropped to keep within the cap per view, by tier",
            labels=["tier"],
        )
        per_tier: dict[str, int] = {}
        trimmed_per_tier: dict[str, int] = {}
        for view in views.values():
            for tier, tier_view in view.tiers.items():
                per_tier[tier] = per_tier.get(tier, 0) + len(tier_view.blocks)
                trimmed_per_tier[tier] = trimmed_per_tier.get(tier, 0) + tier_view.trimmed
        for tier, count in sorted(per_tier.items()):
            blocks.add_metric([tier], count)
            trimmed.add_metric([tier], trimmed_per_tier[tier])
        yield blocks
        yield trimmed
