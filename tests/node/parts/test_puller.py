"""``BlockPuller`` on its own, against a real TCP block server on loopback: verified blocks
land in the pool, a wrong checksum is refused and counted, a silent peer times out within
the puller's bound, and each pull's bandwidth is recorded per source."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import numpy as np

from shared.engine.engine import LLMEngine
from shared.kv.checksum import BlockChecksum
from shared.node.puller import BlockPuller, PullSource
from shared.transfer.tcp import encode_address
from tests.engine.conftest import EngineFactory
from tests.node.parts.rig import PLAIN, prompt, tcp_server

LEASE = "lease-1"


def cached_source(engine: LLMEngine) -> tuple[list[int], list[int]]:
    """Caches a prompt's six full blocks in ``engine`` (its last token's block is never
    cached); their block ids and checksums."""
    tokens = prompt(1, 25)
    engine.generate([tokens], PLAIN)
    pinned = engine.exchange.pin(engine.exchange.prompt_hashes(tokens, b""))
    assert len(pinned) == 6
    return [b for b, _ in pinned], [c for _, c in pinned]


def provider(engine: LLMEngine) -> Callable[[str, Sequence[int]], list[np.ndarray] | None]:
    def provide(lease_id: str, block_ids: Sequence[int]) -> list[np.ndarray] | None:
        if lease_id != LEASE:
            return None
        return [engine.runner.cache.block_buffer(b) for b in block_ids]

    return provide


def same_bytes(a: LLMEngine, a_ids: list[int], b: LLMEngine, b_ids: list[int]) -> list[bool]:
    ca, cb = a.runner.cache, b.runner.cache
    return [
        bytes(ca.block_buffer(x).data) == bytes(cb.block_buffer(y).data)
        for x, y in zip(a_ids, b_ids, strict=True)
    ]


def test_a_verified_pull_fills_the_pool_and_records_bandwidth(make_engine: EngineFactory) -> None:
    source, dest = make_engine(), make_engine()
    ids, sums = cached_source(source)

    async def scenario() -> None:
        async with tcp_server(provider(source)) as server:
            puller = BlockPuller(dest.runner.cache, BlockChecksum(b""))
            try:
                origin = PullSource("src", "tcp", server.address, LEASE, ids, sums)
                into = list(range(40, 46))
                assert await puller.pull(origin, into) == 6
                assert all(same_bytes(source, ids, dest, into))
                assert (puller.pulls_ok, puller.pulls_failed, puller.blocks_pulled) == (1, 0, 6)
                assert puller.bytes_received == 6 * dest.runner.cache.layout.block_bytes
                assert puller.bandwidth.by_source["src"] > 0
            finally:
                await puller.close()

    asyncio.run(scenario())


def test_a_wrong_checksum_is_refused_and_counted(make_engine: EngineFactory) -> None:
    source, dest = make_engine(), make_engine()
    ids, sums = cached_source(source)
    sums[2] ^= 1  # the third block is not what the source said it would be

    async def scenario() -> None:
        async with tcp_server(provider(source)) as server:
            puller = BlockPuller(dest.runner.cache, BlockChecksum(b""))
            try:
                origin = PullSource("src", "tcp", server.address, LEASE, ids, sums)
                assert await puller.pull(origin, list(range(40, 46))) == 2
                assert (puller.pulls_ok, puller.pulls_failed, puller.blocks_pulled) == (0, 1, 2)
                # Another node's key makes every block's checksum wrong.
                other_key = BlockPuller(dest.runner.cache, BlockChecksum(b"another secret"))
                good = PullSource(
                    "src", "tcp", server.address, LEASE, ids, cached_sums(source, ids)
                )
                assert await other_key.pull(good, list(range(40, 46))) == 0
                assert other_key.pulls_failed == 1
                await other_key.close()
            finally:
                await puller.close()

    asyncio.run(scenario())


def cached_sums(engine: LLMEngine, ids: list[int]) -> list[int]:
    cache = engine.runner.cache
    return [engine.checksum(cache.block_buffer(b).data) for b in ids]


def test_a_silent_peer_times_out_within_the_bound(make_engine: EngineFactory) -> None:
    dest = make_engine()
    timeout_s = 0.5

    async def scenario() -> None:
        held: list[asyncio.StreamWriter] = []

        async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # accepts and never answers

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        puller = BlockPuller(dest.runner.cache, BlockChecksum(b""), timeout_s=timeout_s)
        try:
            origin = PullSource("dead", "tcp", encode_address("127.0.0.1", port), LEASE, [0], [0])
            # A bound on the hang, generous for a busy host: a pull that ignored its own
            # timeout would run into it.
            async with asyncio.timeout(timeout_s + 10.0):
                assert await puller.pull(origin, [5]) == 0
            assert (puller.pulls_failed, puller.blocks_pulled) == (1, 0)
            assert "dead" not in puller.bandwidth.by_source
        finally:
            await puller.close()
            for writer in held:
                writer.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())
