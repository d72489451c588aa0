"""Acknowledged hand-offs between real prefill and decode services (tiny engines, TCP block
servers, in-memory bus): the tokens, the acks, the owner notice, refusals and fallbacks."""

from __future__ import annotations

import asyncio

from shared import subjects
from shared.cluster_messages import PullPlan
from shared.engine.engine import LLMEngine
from shared.kv.checksum import BlockChecksum
from shared.messages import ReplayReply, ReplayRequest
from shared.node.leases import LeaseKind
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.node.cluster import GREEDY, Cluster, Stream, request


def expected_tokens(make_engine: EngineFactory, prompt: list[int]) -> list[int]:
    engine: LLMEngine = make_engine()
    return engine.generate([prompt], GREEDY)[0].output_token_ids


def finished(stream: Stream) -> bool:
    return stream.ended


def test_a_handoff_streams_the_single_engine_tokens(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 22, 22, seed=50)[0]

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start()
        try:
            ack, stream = await cluster.submit(request("r1", prompt))
            assert ack.accepted and ack.node_id == "p0" and ack.epoch
            await stream.wait(finished)
            assert stream.tokens == expected_tokens(make_engine, prompt)
            owners = [c for c in stream.chunks if c.owner]
            assert [(c.owner, c.node_id, c.index) for c in owners] == [("d0", "p0", 1)]
            assert stream.chunks[0].node_id == "p0" and stream.chunks[-1].node_id == "d0"
            assert stream.chunks[-1].finish_reason == "length"
            d0, p0 = cluster.decodes["d0"], cluster.prefills["p0"]
            assert d0.node.puller.pulls_ok == 1
            await cluster.bus.settle()
            assert p0.node.leases.count(LeaseKind.HANDOFF) == 0
            engine = p0.node.host.engine
            assert engine.pool.num_free_blocks == engine.config.num_kv_blocks
            replay = await cluster.bus.request(
                subjects.replays("d0"), ReplayRequest(request_id="r1", from_index=0),
                ReplayReply, 1.0,
            )  # fmt: skip
            assert replay.known and not replay.running and replay.finish_reason == "length"
            assert replay.index == 0 and replay.token_ids == stream.tokens
        finally:
            await cluster.stop()

    asyncio.run(scenario())


def test_a_refusing_decode_node_passes_the_kv_to_the_next(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 18, 18, seed=51)[0]

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start(decodes=2)
        try:
            cluster.decodes["d0"].node.serving.draining = True
            ack, stream = await cluster.submit(request("r2", prompt), decodes=("d0", "d1"))
            assert ack.accepted
            await stream.wait(finished)
            assert [c.owner for c in stream.chunks if c.owner] == ["d1"]
            assert stream.tokens == expected_tokens(make_engine, prompt)
        finally:
            await cluster.stop()

    asyncio.run(scenario())


def test_no_decode_node_ends_the_request_with_a_503(make_engine: EngineFactory) -> None:
    prompt = prompts(1, 18, 18, seed=52)[0]

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start(decodes=0)
        try:
            ack, stream = await cluster.submit(request("r3", prompt), decodes=("gone",))
            assert ack.accepted
            await stream.wait(finished)
            assert stream.chunks[-1].error_code == 503
            engine = cluster.prefills["p0"].node.host.engine
            await cluster.bus.settle()
            assert engine.pool.num_free_blocks == engine.config.num_kv_blocks
            assert cluster.prefills["p0"].node.leases.count(LeaseKind.HANDOFF) == 0
        finally:
            await cluster.stop()

    asyncio.run(scenario())


def test_a_draining_prefill_node_refuses_tasks(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start()
        try:
            cluster.prefills["p0"].node.serving.draining = True
            ack, _ = await cluster.submit(request("r4", [5, 6, 7]))
            assert not ack.accepted and ack.reason == "draining" and ack.error_code is None
        finally:
            await cluster.stop()

    asyncio.run(scenario())


def corrupt_one_block(service: object) -> None:
    """Makes the node's block server flip a bit in the last block of every pull."""
    blocks = service.node.blocks  # type: ignore[attr-defined]
    provide = blocks.provide

    def tampered(lease_id: str, block_ids: list[int]) -> object:
        buffers = provide(lease_id, block_ids)
        if buffers:
            buffers = [b.copy() for b in buffers]
            buffers[-1][100] ^= 0xFF
        return buffers

    blocks.provide = tampered


def test_a_corrupt_handoff_is_recomputed_with_the_same_tokens(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 22, 22, seed=53)[0]

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start()
        try:
            corrupt_one_block(cluster.prefills["p0"])
            ack, stream = await cluster.submit(request("r5", prompt))
            assert ack.accepted
            await stream.wait(finished)
            assert stream.tokens == expected_tokens(make_engine, prompt)
            d0 = cluster.decodes["d0"].node
            assert d0.puller.pulls_failed == 1 and d0.puller.pulls_ok == 0
            assert d0.host.engine.stats.prompt_tokens_computed == len(prompt)
            await cluster.bus.settle()
            p0 = cluster.prefills["p0"].node
            assert p0.leases.count(LeaseKind.HANDOFF) == 0  # released once anyway
        finally:
            await cluster.stop()

    asyncio.run(scenario())


def test_blocks_checksummed_without_the_cache_secret_are_recomputed(
    make_engine: EngineFactory,
) -> None:
    """Checksums are keyed by the cache secret: a prefill node that checksums its blocks under
    another key (as anyone who rewrote the bytes on the link, but lacks the secret, would have
    to) gets none of them accepted, and the decode node computes the prompt itself."""
    prompt = prompts(1, 22, 22, seed=56)[0]

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start()
        try:
            p0 = cluster.prefills["p0"].node
            p0.host.engine.checksum = BlockChecksum("not the cluster's cache secret")
            ack, stream = await cluster.submit(request("r7", prompt))
            assert ack.accepted
            await stream.wait(finished)
            assert stream.tokens == expected_tokens(make_engine, prompt)
            d0 = cluster.decodes["d0"].node
            assert d0.puller.pulls_failed == 1 and d0.puller.blocks_pulled == 0
            assert d0.host.engine.stats.prompt_tokens_computed == len(prompt)
        finally:
            await cluster.stop()

    asyncio.run(scenario())


def test_a_planned_pull_replaces_computing_the_prefix_unless_it_fails(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 30, 30, seed=54)[0]
    plan = PullPlan(node_id="p1", first_block=0, num_blocks=7)

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start(prefills=2)
        try:
            _, warm = await cluster.submit(request("w", prompt), prefill="p1")
            await warm.wait(finished)
            p0 = cluster.prefills["p0"].node
            _, pulled = await cluster.submit(request("r6", prompt), pulls=(plan,))
            await pulled.wait(finished)
            assert pulled.tokens == warm.tokens
            assert p0.puller.blocks_pulled == 7 and p0.host.engine.stats.prompt_tokens_computed == 2
            assert pulled.chunks[0].num_cached_tokens == 28
            p1 = cluster.prefills["p1"].node
            await cluster.bus.settle()
            assert p1.blocks.pins_served == 1 and p1.leases.count(LeaseKind.PEER_PIN) == 0
            # The same plan naming a node that is gone: its prefix is computed instead.
            other = prompts(1, 30, 30, seed=55)[0]
            gone = PullPlan(node_id="nobody", first_block=0, num_blocks=7)
            _, computed = await cluster.submit(request("r7", other), pulls=(gone,))
            await computed.wait(finished)
            assert computed.chunks[-1].finish_reason == "length"
            assert p0.host.engine.stats.prompt_tokens_computed == 2 + 30
        finally:
            await cluster.stop()

    asyncio.run(scenario())
