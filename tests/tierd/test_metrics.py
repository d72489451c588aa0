"""tierd's /metrics: blocks and bytes per tier against their capacity, and the evictions of
its policy by tier and reason, after real writes to an NVMe folder."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.tierd.holdings import NVME, Holdings
from services.tierd.limits import Limits
from services.tierd.metrics import TierdMetrics
from services.tierd.nvme import NvmeStore
from services.tierd.policy import make_policy
from services.tierd.reads import TierReader
from services.tierd.staging import Staging
from services.tierd.tiering import Tiering
from shared.kv.block_file import BlockHeader, packed_size
from tests.tierd.blocks import make_block


class ListingOnly:
    """The catalogue session's calls tiering makes, answered at once (no cachemeta)."""

    async def register(self, tier: str, headers: Sequence[BlockHeader]) -> None:
        pass

    async def drop(self, tier: str, block_hashes: Sequence[bytes]) -> bool:
        return True


def samples(metrics: TierdMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_capacity_and_ttl_evictions_are_counted_by_policy_tier_and_reason(
    tmp_path: Path,
) -> None:
    blocks = [make_block(256, first_token=i * 4) for i in range(5)]
    capacity = 3 * packed_size(blocks[0][0], True)

    async def scenario() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        nvme = NvmeStore(tmp_path, capacity, fsync=False)
        catalogue: Any = ListingOnly()
        tiering = Tiering(
            nvme, None, Holdings(make_policy("lru")), catalogue, Limits(capacity, capacity)
        )
        for header, payload in blocks:
            await tiering.admit([(header, memoryview(payload))])
        await tiering.delete([blocks[-1][0].block_hash], "ttl")
        sinker: Any = SimpleNamespace(blocks_pulled=0)
        metrics = TierdMetrics(
            "tierd-x", tiering, TierReader(tiering), sinker, Staging(1 << 20, 30.0), "lru"
        )
        return samples(metrics)

    found = asyncio.run(scenario())

    def at(name: str, **labels: str) -> float:
        return found[name, tuple(sorted((labels | {"node": "tierd-x", "tier": NVME}).items()))]

    evicted = "crescent_tierd_evicted_blocks_total"
    assert at(evicted, policy="lru", reason="capacity") == 2
    assert at(evicted, policy="lru", reason="ttl") == 1
    assert at("crescent_tierd_capacity_bytes") == capacity
    assert at("crescent_tierd_blocks") == 2
    assert 0 < at("crescent_tierd_used_bytes") <= capacity
