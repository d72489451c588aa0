"""Prometheus view of a model-running node, refreshed from each heartbeat's snapshot, and the
KV transfers and cache hits it counts as they happen."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared.cluster_messages import NodeStatus
from shared.engine.types import EngineStats

#: Seconds one pull of a request's blocks takes: a few blocks over shared memory to a whole
#: long prompt from S3.
_TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
#: The pool's replacement policy (``shared.kv.pool``): the least recently freed block goes.
POOL_POLICY = "lru"


class NodeMetrics(Collector):
    """Owns the last snapshot; scrapes read it, so a scrape never waits on the engine. Owns
    too the counters and histograms of what the node's event loop sees happen (pulls, cache
    hits by source), which need no snapshot."""

    def __init__(self, node_id: str, role: str) -> None:
        self.labels = {"node": node_id, "role": role}
        self.status: NodeStatus | None = None
        self.stats = EngineStats()
        self.waiting_seqs = 0
        self.pool_evictions = 0
        self.cached_blocks = 0
        kinds = [*self.labels, "transport", "source"]
        self.transfer_bytes = Counter(
            "crescent_kv_transfer_bytes",
            "KV bytes pulled into this node's pool, by transport and source (handoff: a "
            "prefill node's hand-off; peer: another pool; nvme, s3: a tierd; file: this "
            "host's NVMe files read directly)",
            kinds,
            registry=None,
        )
        self.transfer_seconds = Histogram(
            "crescent_kv_transfer_duration_seconds",
            "time of one pull of a request's blocks, by transport and source",
            kinds,
            buckets=_TRANSFER_BUCKETS,
            registry=None,
        )
        self.transfer_failures = Counter(
            "crescent_kv_transfer_failures",
            "pulls that failed (their tokens were computed), by transport and source",
            kinds,
            registry=None,
        )
        self.checksum_failures = Counter(
            "crescent_kv_checksum_failures",
            "blocks that arrived or were read damaged (dropped and computed), by source",
            [*self.labels, "source"],
            registry=None,
        )
        self.cached_tokens = Counter(
            "crescent_cached_prompt_tokens",
            "prompt tokens served from a cache instead of computed, by where they were found "
            "(pool: this node's own; peer: another node's pool; nvme, s3: a tierd's tiers)",
            [*self.labels, "tier"],
            registry=None,
        )
        #: Requests ended by outcome: the request table's own counts, read at scrape.
        self.outcomes: Mapping[str, int] = {}

    def update(self, status: NodeStatus, stats: EngineStats) -> None:
        self.status = status
        self.stats = stats

    def pulled(self, transport: str, source: str, num_bytes: int, seconds: float, ok: bool) -> None:
        """One pull ended: ``num_bytes`` arrived in ``seconds``; ``ok`` False: it failed."""
        labels = (*self.labels.values(), transport, source)
        if not ok:
            self.transfer_failures.labels(*labels).inc()
        if num_bytes > 0:
            self.transfer_bytes.labels(*labels).inc(num_bytes)
            self.transfer_seconds.labels(*labels).observe(seconds)

    def corrupt(self, source: str, num_blocks: int = 1) -> None:
        self.checksum_failures.labels(*self.labels.values(), source).inc(num_blocks)

    def served_from_cache(self, tokens_by_source: Mapping[str, int]) -> None:
        for source, tokens in tokens_by_source.items():
            if tokens > 0:
                self.cached_tokens.labels(*self.labels.values(), source).inc(tokens)

    def collect(self) -> Iterator[Metric]:
        yield from self._snapshot()
        for metric in (
            self.transfer_bytes,
            self.transfer_seconds,
            self.transfer_failures,
            self.checksum_failures,
            self.cached_tokens,
        ):
            yield from metric.collect()
        finished = CounterMetricFamily(
            "crescent_node_requests_finished",
            "requests this node ended, by outcome (stop, length, error, abort; handed_over: "
            "its KV went to a decode node; migrated: handed back while the node drained)",
            labels=[*self.labels, "outcome"],
        )
        for outcome, count in sorted(self.outcomes.items()):
            finished.add_metric([*self.labels.values(), outcome], count)
        yield finished

    def _snapshot(self) -> Iterator[Metric]:
        names, values = list(self.labels), list(self.labels.values())
        s = self.status
        if s is not None:
            for name, value, doc in (
                ("running_sequences", s.running_seqs, "sequences running or waiting"),
                ("waiting_sequences", self.waiting_seqs, "of those, sequences queued to run"),
                ("queued_prompt_tokens", s.queued_tokens, "prompt tokens not yet computed"),
                ("kv_free_blocks", s.free_blocks, "KV blocks not referenced by a sequence"),
                ("kv_total_blocks", s.total_blocks, "KV blocks in the pool"),
                ("kv_cached_blocks", self.cached_blocks, "KV blocks holding a cached prefix"),
                ("kv_block_bytes", s.block_bytes, "bytes of one KV block"),
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
            evicted = CounterMetricFamily(
                "crescent_kv_pool_evicted_blocks",
                "cached blocks the pool reused for new ones, by its replacement policy",
                labels=[*names, "policy"],
            )
            evicted.add_metric([*values, POOL_POLICY], self.pool_evictions)
            yield evicted
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
