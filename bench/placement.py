"""Scheduler placements per second against a real cachemeta: the scheduler's own request path
(hash the prompt, MatchPrefix over gRPC, the cost model, record the placement, hand the task
over) with a stand-in for NATS and the prefill nodes that acknowledges every task at once.
Used by ``bench/cachemeta.py``."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.handlers import SchedulerHandlers
from services.scheduler.lookup import PrefixLookup
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.options import SchedulerOptions
from shared.cluster_messages import PrefillTask, TaskAck
from shared.kv.hashing import root_hash, scope_salt
from shared.messages import GenerateRequest, SamplingSpec
from shared.rpc.client import CacheMetaClient

MODEL, BLOCK_TOKENS, KV_DTYPE = "bench-model", 32, "float32"
SECRET, TENANT = "bench-secret", "bench-tenant"


def scope_root() -> bytes:
    """The root hash the scheduler computes for the benchmark's tenant: workload chains
    built on it are the chains its prompts hash to."""
    return root_hash(MODEL, BLOCK_TOKENS, KV_DTYPE, scope_salt(SECRET.encode(), TENANT))


class CountingBus:
    """Stands in for NATS and for every prefill node: acknowledges each task at once and
    counts them."""

    def __init__(self) -> None:
        self.tasks = 0
        self.pulls = 0

    async def request(self, subject: str, message: Any, kind: type, timeout_s: float) -> TaskAck:
        assert isinstance(message, PrefillTask)
        self.tasks += 1
        self.pulls += bool(message.pulls)
        return TaskAck(accepted=True, node_id=subject.rsplit(".", 1)[-1])

    async def publish(self, subject: str, message: Any) -> None:
        return


@dataclass(frozen=True)
class PlacementStats:
    placements: int
    in_flight: int
    seconds: float
    p50_ms: float
    p99_ms: float
    with_pull: int
    rejected: int

    @property
    def per_s(self) -> float:
        return self.placements / self.seconds


def cluster(prefill_nodes: Sequence[str], decode_nodes: int) -> ClusterView:
    view = ClusterView(heartbeat_timeout_s=3600)
    now = time.monotonic()
    for i, node_id in enumerate(prefill_nodes):
        view.update(_node(node_id, "prefill", now, queued=(i % 7) * 512))
    for i in range(decode_nodes):
        view.update(_node(f"decode-{i:02d}", "decode", now, queued=0))
    return view


def _node(node_id: str, role: str, now: float, queued: int) -> NodeLoad:
    return NodeLoad(
        node_id=node_id,
        role=role,
        queued_tokens=queued,
        running_seqs=4,
        free_blocks=10_000,
        total_blocks=20_000,
        block_size=BLOCK_TOKENS,
        last_seen=now,
        model_id=MODEL,
        kv_dtype=KV_DTYPE,
        block_bytes=BLOCK_TOKENS * 46_080,
    )


async def placement_rate(
    client: CacheMetaClient,
    prompts: Sequence[list[int]],
    prefill_nodes: Sequence[str],
    *,
    calls: int,
    in_flight: int,
) -> PlacementStats:
    """Places ``calls`` requests (prompts taken round-robin), ``in_flight`` at a time."""
    view = cluster(prefill_nodes, decode_nodes=8)
    bus = CountingBus()
    lookup = PrefixLookup(client, timeout_s=1.0, retry_s=1.0)
    handlers = SchedulerHandlers(
        bus,  # type: ignore[arg-type]
        view,
        lookup,
        SchedulerMetrics(view),
        SchedulerOptions(cache_secret=SECRET, max_pending=in_flight),
    )
    sampling = SamplingSpec(max_tokens=16)
    latencies: list[float] = []
    rejected = 0
    next_call = iter(range(calls))

    async def worker() -> None:
        nonlocal rejected
        for i in next_call:
            request = GenerateRequest(
                request_id=f"b{i}",
                tenant=TENANT,
                prompt_token_ids=prompts[i % len(prompts)],
                sampling=sampling,
            )
            started = time.perf_counter()
            reply = await handlers.on_request(request)
            latencies.append(time.perf_counter() - started)
            rejected += not reply.accepted
            if i % 256 == 0:  # the nodes' heartbeats reset what was placed on them
                beat = time.monotonic()
                for node in list(view.nodes.values()):
                    view.update(dataclasses.replace(node, last_seen=beat, placed_tokens=0))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    seconds = time.perf_counter() - started
    await lookup.close()
    q = statistics.quantiles(latencies, n=100)
    return PlacementStats(calls, in_flight, seconds, q[49] * 1e3, q[98] * 1e3, bus.pulls, rejected)
