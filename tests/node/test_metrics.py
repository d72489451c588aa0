"""A node's /metrics text after real hand-offs and pulls (tiny engines, TCP block servers,
in-memory bus): transfer bytes by transport and source, cached tokens by where they were
found, checksum failures, outcomes, and the pool's gauges."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shared.cluster_messages import PullPlan
from shared.node.runtime import NodeRuntime
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.node.cluster import Cluster, request
from tests.node.test_handoffs import corrupt_one_block, finished


async def scrape(node: NodeRuntime) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the node's registry after a heartbeat refreshed its snapshot."""
    await node.beats.status()
    registry = CollectorRegistry()
    registry.register(node.metrics)
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def test_pulls_and_cache_hits_show_in_the_metrics(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 30, 30, seed=60)[0]
    plan = PullPlan(node_id="p1", first_block=0, num_blocks=7)

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start(prefills=2)
        try:
            _, warm = await cluster.submit(request("w", prompt), prefill="p1")
            await warm.wait(finished)
            _, pulled = await cluster.submit(request("m1", prompt), pulls=(plan,))
            await pulled.wait(finished)
            await cluster.bus.settle()
            p0 = await scrape(cluster.prefills["p0"].node)
            assert value(p0, "crescent_cached_prompt_tokens_total", tier="peer") == 28
            assert value(p0, "crescent_cached_prompt_tokens_total", tier="pool") == 0
            peer_bytes = value(
                p0, "crescent_kv_transfer_bytes_total", transport="tcp", source="peer"
            )
            assert peer_bytes > 0
            assert value(p0, "crescent_kv_transfer_duration_seconds_count", source="peer") == 1
            assert value(p0, "crescent_node_requests_finished_total", outcome="handed_over") == 1
            d0 = await scrape(cluster.decodes["d0"].node)
            handoff = value(d0, "crescent_kv_transfer_bytes_total", source="handoff")
            assert handoff > 0 and value(d0, "crescent_kv_checksum_failures_total") == 0
            assert value(d0, "crescent_node_requests_finished_total", outcome="length") == 2
            total = value(d0, "crescent_kv_total_blocks", role="decode")
            assert 0 < value(d0, "crescent_kv_free_blocks") <= total
            assert value(d0, "crescent_kv_cached_blocks") > 0
            assert value(d0, "crescent_waiting_sequences") == 0
            assert ("crescent_kv_pool_evicted_blocks_total", frozenset(
                {("node", "d0"), ("role", "decode"), ("policy", "lru")}
            )) in d0  # fmt: skip

            corrupt_one_block(cluster.prefills["p0"])
            other = prompts(1, 22, 22, seed=61)[0]
            _, bad = await cluster.submit(request("m2", other))
            await bad.wait(finished)
            d0 = await scrape(cluster.decodes["d0"].node)
            assert value(d0, "crescent_kv_checksum_failures_total", source="handoff") == 1
            assert value(d0, "crescent_kv_transfer_failures_total", source="handoff") == 1
        finally:
            await cluster.stop()

    asyncio.run(scenario())
