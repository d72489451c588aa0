"""``NodeBeats`` on its own: a status tells the engine's load and the node's identity; a beat
goes out even while the engine's lock is held (saying what ``bare`` says); health follows
a hung step and the bus."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from shared import subjects
from shared.cluster_messages import NodeStatus
from shared.memory_bus import MemoryBus
from shared.node.beats import NodeBeats
from shared.node.serving import NodeServing
from shared.secrets import secret_fingerprint
from tests.engine.conftest import EngineFactory
from tests.node.cluster import SECRET
from tests.node.parts.rig import PLAIN, Outputs, hang_steps, prompt, serving_node, tcp_server
from tests.support.wait import wait_for_condition

Scenario = Callable[[NodeBeats, MemoryBus, list[NodeStatus]], Awaitable[None]]


@asynccontextmanager
async def beats_of(node: NodeServing) -> AsyncIterator[NodeBeats]:
    async with tcp_server(lambda lease, ids: None) as server:
        yield NodeBeats(
            node, "prefill", "host-1", secret_fingerprint(SECRET), node.puller, server, None,
            node.metrics,
        )  # fmt: skip


def run(engine: Any, scenario: Scenario, **options: Any) -> None:
    async def main() -> None:
        bus = MemoryBus()
        heard: list[NodeStatus] = []

        async def on_beat(status: NodeStatus) -> None:
            heard.append(status)

        await bus.subscribe(subjects.heartbeats("prefill", "n0"), NodeStatus, on_beat)
        node_bus = bus.client()
        try:
            async with serving_node(engine, node_bus, **options) as node, beats_of(node) as beats:
                await scenario(beats, node_bus, heard)
        finally:
            await bus.close()

    asyncio.run(main())


def test_a_status_tells_the_engines_load_and_who_the_node_is(make_engine: EngineFactory) -> None:
    outputs = Outputs()

    async def scenario(beats: NodeBeats, bus: MemoryBus, heard: list[NodeStatus]) -> None:
        host = beats.serving.host
        await host.add("r", prompt(1), PLAIN, b"")
        await outputs.wait_final("r")
        status = await beats.status()
        assert (status.node_id, status.role, status.epoch) == ("n0", "prefill", "epoch-1")
        assert status.healthy and not status.draining and status.block_size == 4
        assert status.secret_fingerprint == secret_fingerprint(SECRET)
        assert status.model_id == host.model_id and status.total_blocks == 64
        assert status.free_blocks == host.engine.pool.num_free_blocks
        assert status.prompt_tokens_computed == 24
        assert status.step_samples  # the steps of "r", drained into this beat
        assert (await beats.status()).step_samples == []

    run(make_engine(), scenario, on_outputs=outputs.on_outputs)


def test_a_beat_goes_out_while_the_engine_lock_is_held(make_engine: EngineFactory) -> None:
    async def scenario(beats: NodeBeats, bus: MemoryBus, heard: list[NodeStatus]) -> None:
        lock = beats.serving.host.engine.lock
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with lock:
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            held.wait(10)
            beats.serving.draining = True
            await beats.beat_now()
            await wait_for_condition(lambda: bool(heard), "a heartbeat")
            beat = heard[-1]
            assert beat.node_id == "n0" and beat.draining and beat.healthy
            assert beat.total_blocks == 0  # the bare status: nothing asked of the engine
            assert beat.ts > 0
        finally:
            release.set()
            holder.join(10)

    run(make_engine(), scenario)


def test_health_follows_a_hung_step_and_the_bus(make_engine: EngineFactory) -> None:
    engine = make_engine()
    release = hang_steps(engine)

    async def scenario(beats: NodeBeats, bus: MemoryBus, heard: list[NodeStatus]) -> None:
        assert beats.healthy() and beats.bare().healthy
        try:
            await beats.serving.host.add("r", prompt(2), PLAIN, b"")
            await wait_for_condition(lambda: not beats.healthy(), "the hung step to show")
            assert not beats.bare().healthy
        finally:
            release.set()
        await wait_for_condition(beats.healthy, "the step to return")
        bus.connected = False
        assert not beats.healthy()  # /healthz tells of the lost bus
        assert beats.engine_healthy() and beats.bare().healthy
        bus.connected = True

    run(engine, scenario, step_timeout_s=0.2)
