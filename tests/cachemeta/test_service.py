"""cachemeta over real gRPC, on SQLite and on Postgres: the API, input checks, restarts."""

from __future__ import annotations

import asyncio
import re

import pytest

from shared.rpc.client import CacheMetaClient, CacheMetaError
from shared.rpc.types import BlockRecord, CatalogueStats, PrefixHolder, TierCapacity
from tests.cachemeta.chains import ROOT, chain, hashes
from tests.cachemeta.conftest import Served, settings_for
from tests.support.loop import BackgroundLoop
from tests.support.wait import wait_for_condition

TOKENS = list(range(100, 140))  # 10 blocks of 4


def test_register_match_drop_touch_list_stats(served: Served) -> None:
    client = served.client
    assert client is not None
    blocks = chain(TOKENS)
    other = chain([7, 7, 7, 7, 8, 8, 8, 8])

    async def scenario() -> None:
        assert await client.register_blocks("n1", "dram", blocks) == 10
        assert await client.register_blocks("n1", "dram", blocks) == 0  # idempotent
        assert await client.register_blocks("n2", "nvme", blocks[:4] + other) == 6
        assert await client.match_prefix(hashes(blocks)) == [
            PrefixHolder("n1", "dram", 10),
            PrefixHolder("n2", "nvme", 4),
        ]
        assert await client.match_prefix(hashes(other)) == [PrefixHolder("n2", "nvme", 2)]
        assert await client.match_prefix(hashes(blocks), tiers=["dram"]) == [
            PrefixHolder("n1", "dram", 10)
        ]
        assert await client.match_prefix(hashes(other), tiers=["dram", "s3"]) == []
        assert await client.match_prefix([]) == []
        assert await client.stats() == CatalogueStats(12, 16, 2, 16 * 4096)

        # Dropping counts only what the holder had; a block goes with its last replica.
        assert await client.drop_blocks("n2", "nvme", [*hashes(other), b"\x00" * 16]) == 2
        assert await client.drop_blocks("n2", "nvme", hashes(other)) == 0
        assert await client.drop_blocks("n1", "dram", hashes(blocks[2:3])) == 1
        assert await client.match_prefix(hashes(blocks)) == [
            PrefixHolder("n2", "nvme", 4),
            PrefixHolder("n1", "dram", 2),
        ]
        assert await client.stats() == CatalogueStats(10, 13, 2, 13 * 4096)

        assert await client.touch_blocks([*hashes(blocks[:2]), hashes(other)[0]]) == 2
        assert await client.touch_blocks(hashes(blocks[:1])) == 1
        nodes = {n.node_id: n for n in await client.list_nodes()}
        assert set(nodes) == {"n1", "n2"}
        assert (nodes["n1"].num_replicas, nodes["n2"].num_replicas) == (9, 4)

    served.call(scenario())
    assert served.service is not None and served.service.catalogue is not None
    # Accesses reach the database on the next flush (the service flushes about every second).
    assert served.call(served.service.catalogue.flush_touches()) == 2
    # The counts answered from memory are the database's.
    in_db = served.call(served.service.catalogue.repository.stats())
    assert in_db == served.call(client.stats()) == CatalogueStats(10, 13, 2, 13 * 4096)
    row = served.call(served.service.catalogue.repository.block(blocks[1].block_hash))
    assert row["access_count"] == 1 and row["last_access"] >= row["created_at"]
    assert "token_ids" not in row  # the catalogue keeps no prompt or completion
    assert row["checksum"] == 2**64 - 2 and row["parent_hash"] == blocks[0].block_hash
    first = served.call(served.service.catalogue.repository.block(blocks[0].block_hash))
    assert first["access_count"] == 2 and first["parent_hash"] == ROOT
    assert served.call(served.service.catalogue.repository.block(hashes(other)[0])) is None


def test_replace_makes_the_blocks_the_whole_tier(served: Served) -> None:
    client = served.client
    assert client is not None
    blocks = chain(TOKENS)

    async def scenario() -> None:
        await client.register_blocks("n1", "dram", blocks[:6])
        await client.register_blocks("n1", "nvme", blocks[:6])
        assert await client.register_blocks("n1", "dram", blocks[3:], replace=True) == 4
        assert await client.match_prefix(hashes(blocks)) == [PrefixHolder("n1", "nvme", 6)]
        assert await client.match_prefix(hashes(blocks[3:])) == [
            PrefixHolder("n1", "dram", 7),
            PrefixHolder("n1", "nvme", 3),
        ]
        assert await client.stats() == CatalogueStats(10, 13, 1, 13 * 4096)
        assert await client.register_blocks("n1", "nvme", [], replace=True) == 0
        # blocks 0..2 were only on NVMe: they are gone from the catalogue.
        assert await client.stats() == CatalogueStats(7, 7, 1, 7 * 4096)
        assert await client.match_prefix(hashes(blocks)) == []

    served.call(scenario())


def test_invalid_input_is_refused_and_the_service_goes_on(served: Served) -> None:
    client = served.client
    assert client is not None
    good = chain(TOKENS[:8])
    short_hash = BlockRecord(b"\x01" * 15, ROOT, [1, 2, 3, 4], 10, 0)
    bad_parent = BlockRecord(b"\x01" * 16, b"", [1, 2, 3, 4], 10, 0)
    huge = BlockRecord(b"\x01" * 16, ROOT, [1, 2, 3, 4], 2**63, 0)
    cases = [
        (lambda: client.register_blocks("n1", "ram", good), "tier 'ram'"),
        (lambda: client.register_blocks("", "dram", good), "node_id must not be empty"),
        (lambda: client.register_blocks("n1", "dram", [*good, short_hash]), "blocks[2].block_hash"),
        (lambda: client.register_blocks("n1", "dram", [bad_parent]), "blocks[0].parent_hash"),
        (lambda: client.register_blocks("n1", "dram", [huge]), "num_bytes"),
        (lambda: client.drop_blocks("n1", "dram", [b"abc"]), "block_hashes[0] is 3 bytes"),
        (lambda: client.match_prefix([good[0].block_hash, b""]), "block_hashes[1] is 0 bytes"),
        (lambda: client.match_prefix(hashes(good), tiers=["dram", "ram"]), "tier 'ram'"),
        (lambda: client.touch_blocks([b"x" * 17]), "17 bytes"),
        (lambda: client.heartbeat("n1", "prefill", ""), "epoch must not be empty"),
        (lambda: client.heartbeat(" n1", "prefill", "e"), "whitespace"),
        (lambda: client.heartbeat("n" * 256, "prefill", "e"), "256 characters"),
        (
            lambda: client.heartbeat("n1", "prefill", "e", [TierCapacity("dram", 1, 0)] * 2),
            "more than once",
        ),
        (
            lambda: client.heartbeat("n1", "prefill", "e", [TierCapacity("tape", 1, 0)]),
            "tier 'tape'",
        ),
    ]
    for call, message in cases:
        with pytest.raises(CacheMetaError, match=re.escape(message)):
            served.call(call())

    async def still_works() -> None:
        assert await client.register_blocks("n1", "dram", good) == 2
        assert await client.match_prefix(hashes(good)) == [PrefixHolder("n1", "dram", 2)]
        assert (await client.stats()).num_replicas == 2  # nothing of the refused calls stuck

    served.call(still_works())


def test_restart_reloads_the_catalogue(served: Served) -> None:
    client = served.client
    assert client is not None
    blocks = chain(TOKENS)

    async def before() -> None:
        assert await client.heartbeat("n1", "prefill", "e1", [TierCapacity("dram", 100, 10)])
        await client.register_blocks("n1", "dram", blocks, replace=True)
        await client.register_blocks("n2", "s3", blocks[:3])
        # Each heartbeat's tiers replace the last ones.
        assert not await client.heartbeat("n1", "prefill", "e1", [TierCapacity("dram", 100, 50)])

    served.call(before())
    stats = served.call(client.stats())
    served.restart()

    async def after() -> None:
        assert await client.match_prefix(hashes(blocks)) == [
            PrefixHolder("n1", "dram", 10),
            PrefixHolder("n2", "s3", 3),
        ]
        assert await client.stats() == stats
        nodes = {n.node_id: n for n in await client.list_nodes()}
        assert nodes["n1"].epoch == "e1" and nodes["n1"].num_replicas == 10
        assert nodes["n1"].tiers == [TierCapacity("dram", 100, 50)]
        # Same epoch: the catalogue still holds its content, no resync.
        assert not await client.heartbeat("n1", "prefill", "e1")
        # n2 never sent a heartbeat nor a replace: it must resync.
        assert await client.heartbeat("n2", "decode", "x1")

    served.call(after())


def test_new_epoch_drops_the_old_replicas_until_resync(served: Served) -> None:
    client = served.client
    assert client is not None
    blocks = chain(TOKENS)

    async def scenario() -> None:
        assert await client.heartbeat("n1", "prefill", "e1")  # unknown node: resync
        assert await client.heartbeat("n1", "prefill", "e1")  # ...until it replaces
        await client.register_blocks("n1", "dram", blocks, replace=True)
        await client.register_blocks("n2", "dram", blocks[:2])
        assert not await client.heartbeat("n1", "prefill", "e1")
        assert await client.heartbeat("n1", "prefill", "e2")  # restarted
        assert await client.match_prefix(hashes(blocks)) == [PrefixHolder("n2", "dram", 2)]
        assert await client.stats() == CatalogueStats(2, 2, 2, 2 * 4096)
        assert await client.heartbeat("n1", "prefill", "e2")
        await client.register_blocks("n1", "dram", blocks[:5], replace=True)
        assert not await client.heartbeat("n1", "prefill", "e2")
        assert (await client.match_prefix(hashes(blocks)))[0] == PrefixHolder("n1", "dram", 5)

    served.call(scenario())


def test_grace_sweep_drops_silent_nodes(bg_loop: BackgroundLoop, db_url: str) -> None:
    served = Served(bg_loop, settings_for(db_url, replica_grace_s=0.6, sweep_interval_s=0.1))
    served.start()
    client = served.client
    assert client is not None
    blocks = chain(TOKENS)

    async def scenario() -> None:
        for node in ("quiet", "chatty"):
            await client.heartbeat(node, "prefill", "e1")
            await client.register_blocks(node, "dram", blocks, replace=True)
        only_chatty = [PrefixHolder("chatty", "dram", 10)]

        async def quiet_swept() -> bool:  # only "chatty" keeps beating meanwhile
            assert not await client.heartbeat("chatty", "prefill", "e1")
            return await client.match_prefix(hashes(blocks)) == only_chatty

        await wait_for_condition(quiet_swept, "the sweep to drop the silent node's replicas")
        nodes = {n.node_id: n.num_replicas for n in await client.list_nodes()}
        assert nodes == {"chatty": 10, "quiet": 0}
        assert await client.heartbeat("quiet", "prefill", "e1")  # same epoch, yet resync
        await client.register_blocks("quiet", "dram", blocks[:1], replace=True)
        assert not await client.heartbeat("quiet", "prefill", "e1")

    try:
        served.call(scenario())
    finally:
        served.close()


def test_concurrent_calls_share_the_channel(served: Served) -> None:
    assert served.service is not None
    client = CacheMetaClient(f"127.0.0.1:{served.service.port}", timeout_s=10, max_in_flight=8)
    chains = [chain([i] * 4 + list(range(40))) for i in range(40)]

    async def scenario() -> None:
        registered = await asyncio.gather(
            *(client.register_blocks(f"n{i % 4}", "dram", c) for i, c in enumerate(chains))
        )
        assert sum(registered) == 40 * 11
        matches = await asyncio.gather(*(client.match_prefix(hashes(c)) for c in chains * 5))
        for i, found in enumerate(matches):
            assert found == [PrefixHolder(f"n{i % 40 % 4}", "dram", 11)]
        await client.close()

    served.call(scenario(), timeout_s=60)


def test_messages_above_the_default_4_mib_cap(served: Served) -> None:
    client = served.client
    assert client is not None
    # 2,200 blocks of 512 token ids of 4 bytes each (as varints): ~4.5 MB in one call.
    tokens = [1 << 22] * 512
    blocks = [BlockRecord(i.to_bytes(16, "big"), ROOT, tokens, 100, i) for i in range(1, 2201)]

    async def scenario() -> None:
        assert await client.register_blocks("n1", "dram", blocks) == len(blocks)
        assert await client.match_prefix(hashes(blocks)) == [PrefixHolder("n1", "dram", 2200)]

    served.call(scenario())
