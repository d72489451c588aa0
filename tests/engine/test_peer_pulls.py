"""Prefill nodes pulling cached prompt blocks from each other: two real prefill handlers with
tiny engines, a real NATS server and real TCP block servers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from services.prefill.handlers import PrefillHandlers
from services.prefill.peers import PeerFetcher
from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import LeaseRelease, PinRequest, PrefillTask, PullPlan
from shared.engine.async_engine import AsyncEngine
from shared.engine.engine import LLMEngine
from shared.messages import GenerateRequest, SamplingSpec, TokenChunk
from shared.node.common import FetchBandwidth
from shared.node.leases import LeaseTable
from shared.sampling_params import SamplingParams
from shared.transfer.base import TransferServer, create_server
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.support.nats import NatsServer

FIRST = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
SECRET = "secret"


@dataclass
class Node:
    handlers: PrefillHandlers
    engine: LLMEngine
    async_engine: AsyncEngine
    server: TransferServer
    bus: Bus

    async def close(self) -> None:
        await self.async_engine.stop()
        await self.handlers.close()
        await self.server.close()
        await self.bus.close()


async def start_node(
    url: str, node_id: str, engine: LLMEngine, corrupt: bool = False, serve_pins: bool = True
) -> Node:
    bus = await Bus.connect(url, node_id)
    holder: list[PrefillHandlers] = []

    def provide(lease_id: str, block_ids: Sequence[int]) -> list[np.ndarray] | None:
        buffers = holder[0].provide(lease_id, block_ids)
        if buffers is not None and corrupt:
            buffers = [b.copy() for b in buffers]
            buffers[-1][7] ^= 0xFF
        return buffers

    server = create_server("tcp", provide)
    await server.start()

    async def on_outputs(outs: list) -> None:  # type: ignore[type-arg]
        await handlers.on_outputs(outs)

    async_engine = AsyncEngine(engine, on_outputs)
    fetcher = PeerFetcher(bus, async_engine, engine.runner.cache, FetchBandwidth(), 0.5)
    handlers = PrefillHandlers(
        bus,
        async_engine,
        engine.runner.cache,
        LeaseTable(ttl_s=30),
        node_id,
        "tcp",
        server.address,
        SECRET,
        fetcher,
    )
    holder.append(handlers)
    async_engine.start()
    await bus.subscribe(subjects.prefill_tasks(node_id), PrefillTask, handlers.on_task)
    await bus.subscribe(subjects.lease_releases(node_id), LeaseRelease, handlers.on_release)
    if serve_pins:
        await bus.serve(subjects.peer_pins(node_id), PinRequest, handlers.on_pin)
    return Node(handlers, engine, async_engine, server, bus)


def task(request_id: str, prompt: list[int], pulls: list[PullPlan]) -> PrefillTask:
    request = GenerateRequest(
        request_id=request_id,
        tenant="alice",
        prompt_token_ids=prompt,
        sampling=SamplingSpec.from_params(FIRST),
    )
    return PrefillTask(request=request, decode_node="d0", pulls=pulls)


async def first_token(bus: Bus, node_id: str, t: PrefillTask) -> TokenChunk:
    got: asyncio.Queue[TokenChunk] = asyncio.Queue()

    async def on_chunk(chunk: TokenChunk) -> None:
        await got.put(chunk)

    sub = await bus.subscribe(subjects.tokens(t.request.request_id), TokenChunk, on_chunk)
    await bus.publish(subjects.prefill_tasks(node_id), t)
    chunk = await asyncio.wait_for(got.get(), 30)
    await sub.unsubscribe()
    return chunk


async def scenario(
    url: str, a_engine: LLMEngine, b_engine: LLMEngine, prompt: list[int], **a_options: bool
) -> tuple[TokenChunk, TokenChunk, Node, Node]:
    a = await start_node(url, "pa", a_engine, **a_options)
    b = await start_node(url, "pb", b_engine)
    try:
        warm = await first_token(a.bus, "pa", task("warm", prompt, []))
        blocks = (len(prompt) - 1) // b_engine.config.block_size
        plan = PullPlan(node_id="pa", first_block=0, num_blocks=blocks)
        pulled = await first_token(b.bus, "pb", task("r", prompt, [plan]))
        for _ in range(100):  # the release reaches A after B's first token
            if a.handlers.leases.leases == {}:
                break
            await asyncio.sleep(0.02)
    finally:
        await a.close()
        await b.close()
    return warm, pulled, a, b


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> str:
    server = NatsServer.start(Path(tmp_path_factory.mktemp("nats")))
    yield server.url  # type: ignore[misc]
    server.stop()


def test_a_planned_pull_replaces_computing_the_prefix(
    nats: str, make_engine: EngineFactory
) -> None:
    prompt = prompts(1, 30, 30, seed=40)[0]
    a_engine, b_engine = make_engine(), make_engine()
    warm, pulled, a, b = asyncio.run(scenario(nats, a_engine, b_engine, prompt))
    assert pulled.token_ids == warm.token_ids
    assert pulled.num_cached_tokens == 28  # 7 blocks of 4 pulled; the last 2 tokens computed
    assert b_engine.stats.prompt_tokens_computed == 2
    assert a.handlers.pins_served == 1 and a.handlers.leases.leases == {}
    assert a_engine.exchange.num_pins == 0
    assert a_engine.pool.num_free_blocks == a_engine.config.num_kv_blocks
    assert b.handlers.fetcher.blocks_pulled == 7


def test_a_corrupt_pull_is_computed_instead(nats: str, make_engine: EngineFactory) -> None:
    prompt = prompts(1, 30, 30, seed=41)[0]
    a_engine, b_engine = make_engine(), make_engine()
    warm, pulled, _, b = asyncio.run(scenario(nats, a_engine, b_engine, prompt, corrupt=True))
    assert pulled.token_ids == warm.token_ids
    # The last of the 7 blocks was corrupted on the way: 6 verified blocks are used.
    assert b_engine.stats.prompt_tokens_computed == 30 - 24
    assert b.handlers.fetcher.pulls_failed == 1
    assert a_engine.exchange.num_pins == 0


def test_a_silent_peer_costs_a_timeout_not_the_request(
    nats: str, make_engine: EngineFactory
) -> None:
    prompt = prompts(1, 30, 30, seed=42)[0]
    a_engine, b_engine = make_engine(), make_engine()
    warm, pulled, _, b = asyncio.run(scenario(nats, a_engine, b_engine, prompt, serve_pins=False))
    assert pulled.token_ids == warm.token_ids
    assert b_engine.stats.prompt_tokens_computed == 30
    assert b.handlers.fetcher.pulls_failed == 1
