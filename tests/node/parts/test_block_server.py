"""``BlockServer`` on its own, behind a real TCP transfer server: a pin leases only the
leading cached blocks, a pull with the lease's token gets exactly those blocks, the lease
ends once (its pin with it), and expiry ends it too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest

from shared.cluster_messages import PinRequest
from shared.engine.engine import LLMEngine
from shared.node.engine_host import EngineHost
from shared.node.leases import LeaseTable
from shared.node.pins import BlockServer
from shared.transfer.base import TransferError
from shared.transfer.tcp_client import TcpTransferClient
from tests.engine.conftest import EngineFactory
from tests.node.parts.rig import PLAIN, prompt, running_host, tcp_server

TOKENS = prompt(1, 25)  # six full blocks


@asynccontextmanager
async def block_server(engine: LLMEngine, ttl_s: float) -> AsyncIterator[BlockServer]:
    engine.generate([TOKENS], PLAIN)
    servers: list[BlockServer] = []
    async with (
        running_host(engine) as (host, _),
        tcp_server(lambda lease, ids: servers[0].provide(lease, ids)) as transfer,
    ):
        servers.append(BlockServer(host, host.cache, LeaseTable(ttl_s), "tcp", transfer.address))
        yield servers[0]


def refs(host: EngineHost, block_ids: list[int]) -> list[int]:
    return [host.engine.pool.blocks[b].ref_cnt for b in block_ids]


def test_a_pin_leases_the_leading_cached_blocks_for_one_pull(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with block_server(make_engine(), ttl_s=60.0) as blocks:
            host = blocks.engine
            hashes = host.prompt_hashes(TOKENS, b"")
            absent = host.prompt_hashes(prompt(2, 25), b"")
            # A chain broken after its third block: only the three before the gap are lent.
            reply = await blocks.on_pin(
                PinRequest(block_hashes=hashes[:3] + absent[:1] + hashes[3:])
            )
            assert reply.lease_id and len(reply.block_ids) == 3
            assert reply.block_checksums == host.block_checksums(reply.block_ids)
            assert refs(host, reply.block_ids) == [1, 1, 1]
            assert reply.transfer_address == blocks.transfer_address

            client = TcpTransferClient(timeout_s=5.0)
            cache = host.cache
            try:
                dest = [np.zeros_like(cache.block_buffer(0)) for _ in range(3)]
                await client.pull(reply.transfer_address, reply.lease_id, reply.block_ids, dest)
                assert [bytes(d.data) for d in dest] == [
                    bytes(cache.block_buffer(b).data) for b in reply.block_ids
                ]
                other = [next(b for b in range(cache.num_blocks) if b not in reply.block_ids)]
                with pytest.raises(TransferError):
                    await client.pull(reply.transfer_address, reply.lease_id, other, dest[:1])
                with pytest.raises(TransferError):
                    await client.pull(reply.transfer_address, "forged", reply.block_ids, dest)
            finally:
                await client.close()

            ended = await blocks.release(reply.lease_id)
            assert ended is not None and ended.block_ids == reply.block_ids
            assert refs(host, reply.block_ids) == [0, 0, 0]
            assert await blocks.release(reply.lease_id) is None  # ended once only
            assert refs(host, reply.block_ids) == [0, 0, 0]
            assert blocks.provide(reply.lease_id, reply.block_ids) is None

    asyncio.run(scenario())


def test_nothing_cached_grants_no_lease(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with block_server(make_engine(), ttl_s=60.0) as blocks:
            absent = blocks.engine.prompt_hashes(prompt(2, 25), b"")
            reply = await blocks.on_pin(PinRequest(block_hashes=absent))
            assert (reply.lease_id, reply.block_ids) == ("", [])
            assert len(blocks.leases) == 0 and blocks.pins_served == 0

    asyncio.run(scenario())


def test_an_expired_pin_is_ended(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        # A lease whose time is up as soon as it is granted.
        async with block_server(make_engine(), ttl_s=0.0) as blocks:
            host = blocks.engine
            reply = await blocks.on_pin(PinRequest(block_hashes=host.prompt_hashes(TOKENS, b"")))
            assert refs(host, reply.block_ids) == [1] * 6
            assert blocks.provide(reply.lease_id, reply.block_ids) is None
            await blocks.expire()
            assert refs(host, reply.block_ids) == [0] * 6
            assert len(blocks.leases) == 0
            assert await blocks.release(reply.lease_id) is None

    asyncio.run(scenario())
