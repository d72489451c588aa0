"""``SinkServer`` on its own: it offers cold cached blocks no lower tier holds, under a sink
lease; it offers a block again only after tierd's word is lost to a restart (a new epoch),
and marks blocks sunk only when tierd says so."""

from __future__ import annotations

import asyncio

from shared.cluster_messages import SinkDone, SinkRequest
from shared.node.engine_host import EngineHost
from shared.node.leases import LeaseKind, LeaseTable
from shared.node.sink import SinkServer
from tests.engine.conftest import EngineFactory
from tests.node.parts.rig import PLAIN, prompt, running_host

ADDRESS = b"tcp://127.0.0.1:1"


async def end_offer(host: EngineHost, leases: LeaseTable, token: str) -> None:
    """What the node does once tierd copied an offer: the lease ends and the pin with it."""
    lease = leases.release(token)
    assert lease is not None
    await host.unpin(lease.block_ids)


def test_offers_unsunk_blocks_marks_them_on_tierds_word_and_forgets_on_restart(
    make_engine: EngineFactory,
) -> None:
    async def scenario() -> None:
        engine = make_engine()
        engine.generate([prompt(1, 25)], PLAIN)  # six cold cached blocks, plus its output's
        pool = engine.pool
        cached = pool.num_cached_blocks
        assert pool.num_unsunk == cached >= 6
        leases = LeaseTable(60.0)
        async with running_host(engine) as (host, _):
            sinks = SinkServer(host, leases, "tcp", ADDRESS, host.block_bytes)
            offer = await sinks.on_sink(SinkRequest(max_blocks=4, epoch="t1"))
            assert offer.lease_id and len(offer.blocks) == 4
            assert leases.count(LeaseKind.SINK_OFFER) == 1
            assert all(pool.blocks[b.block_id].ref_cnt == 1 for b in offer.blocks)
            assert offer.model_id == host.model_id and offer.block_bytes == host.block_bytes
            first = {b.block_hash for b in offer.blocks}

            # Offered and not yet reported: the next ask offers others.
            rest = await sinks.on_sink(SinkRequest(max_blocks=4096, epoch="t1"))
            assert {b.block_hash for b in rest.blocks}.isdisjoint(first)
            assert len(first) + len(rest.blocks) == cached
            assert pool.num_unsunk == cached  # offering marks nothing

            await end_offer(host, leases, offer.lease_id)
            await end_offer(host, leases, rest.lease_id)
            await sinks.on_sunk(SinkDone(lease_id=offer.lease_id, sunk=sorted(first)))
            assert sinks.blocks_sunk == 4 and pool.num_unsunk == cached - 4

            # Same tierd: what it holds, and what it was just offered, is not offered again.
            again = await sinks.on_sink(SinkRequest(max_blocks=4096, epoch="t1"))
            assert again.lease_id == "" and again.blocks == []

            # A restarted tierd may have lost it all: every block is offered anew.
            fresh = await sinks.on_sink(SinkRequest(max_blocks=4096, epoch="t2"))
            assert pool.num_unsunk == cached
            assert first <= {b.block_hash for b in fresh.blocks}
            await end_offer(host, leases, fresh.lease_id)

    asyncio.run(scenario())
