"""Prometheus view of a tierd, read from its counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.tierd.holdings import NVME, S3
from services.tierd.reads import TierReader
from services.tierd.sinker import Sinker
from services.tierd.staging import Staging
from services.tierd.tiering import Tiering


class TierdMetrics(Collector):
    """Owns nothing: every scrape reads the live counters of the parts it was given."""

    def __init__(
        self,
        node_id: str,
        tiering: Tiering,
        reader: TierReader,
        sinker: Sinker,
        staging: Staging,
        policy: str = "",
    ) -> None:
        self.node_id = node_id
        self.policy = policy
        self.tiering = tiering
        self.reader = reader
        self.sinker = sinker
        self.staging = staging

    def collect(self) -> Iterator[Metric]:
        t, node = self.tiering, self.node_id
        stores = {NVME: t.nvme, S3: t.s3}
        blocks = GaugeMetricFamily(
            "crescent_tierd_blocks", "blocks held per tier", labels=["node", "tier"]
        )
        used = GaugeMetricFamily(
            "crescent_tierd_used_bytes", "bytes stored per tier", labels=["node", "tier"]
        )
        for tier, store in stores.items():
            if store is not None:
                blocks.add_metric([node, tier], store.num_blocks)
                used.add_metric([node, tier], store.used_bytes)
        yield blocks
        yield used
        yield self._capacity()
        yield self._evicted()
        yield _per_tier(
            "crescent_tierd_corrupt_blocks",
            "stored blocks found damaged on read and dropped",
            node,
            t.counters.corrupt,
        )
        yield _per_tier("crescent_tierd_written_blocks", "blocks written", node, t.counters.written)
        yield _per_tier("crescent_tierd_read_blocks", "blocks read", node, self.reader.blocks_read)
        deleted = CounterMetricFamily(
            "crescent_tierd_deleted_blocks",
            "block copies deleted, by reason (moved, capacity, quota, ttl)",
            labels=["node", "reason"],
        )
        for reason, count in t.counters.deleted.items():
            deleted.add_metric([node, reason], count)
        yield deleted
        bandwidth = GaugeMetricFamily(
            "crescent_tierd_read_bandwidth_bytes",
            "measured read bandwidth per tier (bytes/s)",
            labels=["node", "tier"],
        )
        for tier, rate in self.reader.bandwidth.by_tier.items():
            bandwidth.add_metric([node, tier], rate)
        yield bandwidth
        for name, value, doc in (
            ("sunk_blocks", self.sinker.blocks_pulled, "blocks pulled from pools to sink"),
            ("refused_blocks", t.counters.refused, "offered blocks not kept (room, quota)"),
        ):
            counter = CounterMetricFamily(f"crescent_tierd_{name}", doc, labels=["node"])
            counter.add_metric([node], value)
            yield counter
        staged = GaugeMetricFamily(
            "crescent_tierd_staged_bytes", "read-up bytes awaiting a pull", labels=["node"]
        )
        staged.add_metric([node], self.staging.used_bytes)
        yield staged
        up = GaugeMetricFamily("crescent_tierd_s3_up", "1 while S3 is usable", labels=["node"])
        up.add_metric([node], 1.0 if t.s3_usable else 0.0)
        yield up

    def _capacity(self) -> GaugeMetricFamily:
        t = self.tiering
        capacity = GaugeMetricFamily(
            "crescent_tierd_capacity_bytes",
            "bytes each tier may hold (0: S3 unbounded)",
            labels=["node", "tier"],
        )
        capacity.add_metric([self.node_id, NVME], t.nvme.capacity_bytes)
        if t.s3 is not None:
            capacity.add_metric([self.node_id, S3], t.limits.s3_capacity_bytes)
        return capacity

    def _evicted(self) -> CounterMetricFamily:
        evicted = CounterMetricFamily(
            "crescent_tierd_evicted_blocks",
            "block copies evicted from a tier, by the eviction policy that chose them and why "
            "(capacity, quota, ttl)",
            labels=["node", "tier", "policy", "reason"],
        )
        for (tier, reason), count in sorted(self.tiering.counters.evicted.items()):
            evicted.add_metric([self.node_id, tier, self.policy, reason], count)
        return evicted


def _per_tier(name: str, doc: str, node: str, values: dict[str, int]) -> CounterMetricFamily:
    counter = CounterMetricFamily(name, doc, labels=["node", "tier"])
    for tier, value in values.items():
        counter.add_metric([node, tier], value)
    return counter
