"""tierd and the keep ledger: a kept block, and every block leading to it, is no victim of
capacity, quota or TTL until its keep ends, on a real NVMe folder as in the holdings."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

from services.tierd.holdings import NVME, Holdings
from services.tierd.limits import Limits
from services.tierd.nvme import NvmeStore
from services.tierd.policy import LruPolicy, make_policy
from services.tierd.tiering import Tiering
from shared.kv.block_file import packed_size
from tests.tierd.blocks import make_block, make_chain
from tests.tierd.test_holdings import A, B, chain, h, names
from tests.tierd.test_metrics import ListingOnly


def holdings_of(*chains: list[Any], now: float = 0.0) -> Holdings:
    held = Holdings(LruPolicy())
    for headers in chains:
        for header in headers:
            held.add(header, NVME, now=now)
    return held


def test_kept_blocks_and_their_prefix_are_no_victims_until_the_keep_ends() -> None:
    held = holdings_of(chain("k", 3), chain("o", 3))
    held.touch([h("o0"), h("o1"), h("o2")], now=5.0)  # the unkept chain is the hotter one
    held.set_kept({h("k1"): 100.0})
    assert held.protected(now=50.0) == {h("k0"), h("k1")}
    # Everything may go but k0 and k1: the kept block's tail first, then the other chain.
    assert names(held.victims(10_000, now=50.0)) == ["k2", "o2", "o1", "o0"]
    assert held.protected(now=100.0) == set()
    assert len(held.victims(10_000, now=100.0)) == 6


def test_a_pin_outlives_any_time_and_a_quota_spares_kept_blocks() -> None:
    held = holdings_of(chain("a", 2, quota=A), chain("b", 2, quota=B))
    held.set_kept({h("a1"): math.inf})
    assert held.victims(10_000, now=1e12, quota_key=A) == []
    assert names(held.victims(10_000, now=1e12, quota_key=B)) == ["b1", "b0"]


def test_kept_blocks_do_not_expire() -> None:
    held = holdings_of(chain("k", 2), chain("o", 2))
    held.set_kept({h("k0"): 500.0})
    assert names(held.expired(now=400.0, ttl_s=10.0)) == ["k1", "o1", "o0"]
    assert len(held.expired(now=500.0, ttl_s=10.0)) == 4


def test_a_full_nvme_tier_evicts_around_a_kept_chain_and_refuses_when_only_it_is_left(
    tmp_path: Path,
) -> None:
    kept = make_chain(2, seed=1)
    others = [make_block(256, first_token=1000 + 10 * i) for i in range(4)]
    capacity = 3 * packed_size(kept[0][0], True)

    async def scenario() -> None:
        nvme = NvmeStore(tmp_path, capacity, fsync=False)
        catalogue: Any = ListingOnly()
        holdings = Holdings(make_policy("lru"))
        tiering = Tiering(nvme, None, holdings, catalogue, Limits(capacity, capacity))
        await tiering.admit([(hd, memoryview(p)) for hd, p in kept])
        holdings.set_kept({hd.block_hash: math.inf for hd, _ in kept})
        for header, payload in others:
            assert await tiering.admit([(header, memoryview(payload))]) == [header.block_hash]
        held = set(holdings.blocks)
        assert {hd.block_hash for hd, _ in kept} <= held and len(held) == 3
        # Once the keep is the whole tier, a new block is refused rather than a kept one lost.
        holdings.set_kept({hd.block_hash: math.inf for hd, _ in [*kept, others[-1]]})
        late, payload = make_block(256, first_token=9000)
        assert await tiering.admit([(late, memoryview(payload))]) == []
        # The ledger dropped the keeps: the blocks are ordinary again.
        holdings.set_kept({})
        assert await tiering.admit([(late, memoryview(payload))]) == [late.block_hash]

    asyncio.run(scenario())


def test_the_ttl_round_spares_kept_blocks(tmp_path: Path) -> None:
    kept, other = make_chain(2, seed=1), make_chain(2, seed=2)
    now = [1000.0]

    async def scenario() -> set[bytes]:
        nvme = NvmeStore(tmp_path, 1 << 20, fsync=False)
        catalogue: Any = ListingOnly()
        holdings = Holdings(make_policy("lru"))
        limits = Limits(1 << 20, 1 << 20, ttl_s=60.0)
        tiering = Tiering(nvme, None, holdings, catalogue, limits, clock=lambda: now[0])
        await tiering.admit([(hd, memoryview(p)) for hd, p in [*kept, *other]])
        holdings.set_kept({kept[1][0].block_hash: 2000.0})
        now[0] = 1500.0
        await tiering.maintain()
        return set(holdings.blocks)

    left = asyncio.run(scenario())
    assert left == {hd.block_hash for hd, _ in kept}
