"""Prometheus view of a model-running node, refreshed from each heartbeat's snapshot."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.cluster_messages import NodeStatus
from shared.engine.types import EngineStats


class NodeMetrics(Collector):
    """Owns the last snapshot; scrapes read it, so a scrape never waits on the engine."""

    def __init__(self, node_id: str, role: str) -> None:
        self.labels = {"node": node_id, "role": role}
        self.status: NodeStatus | None = None
        self.stats = EngineStats()

    def update(self, status: NodeStatus, stats: EngineStats) -> None:
        self.status = status
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        names, values = list(self.labels), list(self.labels.values())
        s = self.status
        if s is not None:
            for name, value, doc in (
                ("running_sequences", s.running_seqs, "sequences running or waiting"),
                ("queued_prompt_tokens", s.queued_tokens, "prompt tokens not yet computed"),
                ("kv_free_blocks", s.free_blocks, "KV blocks not referenced by a sequence"),
                ("kv_total_blocks", s.total_blocks, "KV blocks in the pool"),
            ):
                gauge = GaugeMetricFamily(f"crescent_{name}", doc, labels=names)
                gauge.add_metric(values, value)
                yield gauge
            for name, value, doc in (
                ("kv_bytes_sent", s.kv_bytes_sent, "KV bytes served to peers"),
                ("kv_bytes_received", s.kv_bytes_received, "KV bytes pulled from peers"),
            ):
                counter = CounterMetricFamily(f"crescent_{name}", doc, labels=names)
                counter.add_metric(values, value)
                yield counter
        st = self.stats
        for name, value, doc in (
            (
                "prompt_tokens_computed",
                st.prompt_tokens_computed,
                "prompt tokens run through the model",
            ),
            (
                "prompt_tokens_cached",
                st.prompt_tokens_cached,
                "prompt tokens reused from the cache",
            ),
            ("prompt_tokens_imported", st.prompt_tokens_imported, "prompt tokens pulled as KV"),
            ("output_tokens", st.output_tokens, "tokens generated"),
            ("preemptions", st.preemptions, "sequences preempted for lack of blocks"),
            ("engine_steps", st.steps, "forward passes"),
        ):
            counter = CounterMetricFamily(f"crescent_{name}", doc, labels=names)
            counter.add_metric(values, value)
            yield counter
