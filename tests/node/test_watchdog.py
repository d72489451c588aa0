"""A node whose engine step hangs says so (heartbeat and /healthz), takes no new work, and
recovers when the step returns; a node using another cache secret is told apart."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from shared import subjects
from shared.cluster_messages import NodeStatus
from shared.engine.types import EngineStats
from shared.memory_bus import MemoryBus
from shared.node.engine_host import FULL_STEP_MARGIN, EngineHost
from shared.secrets import secret_fingerprint
from tests.engine.conftest import EngineFactory
from tests.node.cluster import SECRET, Cluster, request
from tests.support.wait import wait_for_condition


def test_a_hung_step_makes_the_node_unhealthy_until_it_returns(
    make_engine: EngineFactory,
) -> None:
    release = threading.Event()

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start(decodes=0, step_timeout_s=0.3)
        p0 = cluster.prefills["p0"].node
        execute = p0.host.engine.runner.execute

        def hangs(plan: Any) -> Any:
            release.wait(10)
            return execute(plan)

        p0.host.engine.runner.execute = hangs  # type: ignore[method-assign]
        beats: list[NodeStatus] = []

        async def on_beat(status: NodeStatus) -> None:
            beats.append(status)

        await cluster.bus.subscribe(subjects.heartbeats("prefill", "p0"), NodeStatus, on_beat)
        try:
            ack, _ = await cluster.submit(request("h1", [3, 4, 5]), decodes=("nobody",))
            assert ack.accepted
            await wait_for_condition(lambda: not p0.beats.healthy(), "the watchdog to notice")
            await wait_for_condition(
                lambda: bool(beats) and not beats[-1].healthy, "a heartbeat saying unhealthy"
            )
            refused, _ = await cluster.submit(request("h2", [3, 4, 5]))
            assert not refused.accepted and refused.reason == "unhealthy"
            release.set()
            await wait_for_condition(p0.beats.healthy, "the node to recover")
            await wait_for_condition(lambda: beats[-1].healthy, "a heartbeat saying healthy")
        finally:
            release.set()
            await cluster.stop()

    asyncio.run(scenario())


def test_heartbeats_carry_the_cache_secret_fingerprint(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start(decodes=0)
        try:
            status = await cluster.prefills["p0"].node.beats.status()
            assert status.secret_fingerprint == secret_fingerprint(SECRET)
            assert status.epoch == cluster.prefills["p0"].node.epoch and status.healthy
        finally:
            await cluster.stop()

    asyncio.run(scenario())


def count_beats_made(node: Any) -> list[int]:
    """A one-item counter of the statuses ``node`` makes (each beat, sent or not)."""
    made, snapshot = [0], node.host.load_snapshot

    async def counted() -> Any:
        made[0] += 1
        return await snapshot()

    node.host.load_snapshot = counted
    return made


def test_a_node_whose_bus_dropped_stays_quiet_then_beats_healthy(
    make_engine: EngineFactory,
) -> None:
    # After a NATS restart, a beat made while the bus was down used to arrive once it was back
    # saying "unhealthy" (the bus was down when it was made), and the gateway moved every
    # stream off nodes that had never stopped.
    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start(decodes=0)
        node = cluster.prefills["p0"].node
        beats: list[NodeStatus] = []

        async def on_beat(status: NodeStatus) -> None:
            beats.append(status)

        await cluster.bus.subscribe(subjects.heartbeats("prefill", "p0"), NodeStatus, on_beat)
        try:
            assert isinstance(node.bus, MemoryBus)
            made = count_beats_made(node)
            node.bus.connected = False
            assert not node.beats.healthy()  # /healthz tells of the lost bus
            status = await node.beats.status()
            assert status.healthy  # a beat that arrives proves the bus
            # Counted in beats the loop made, not seconds: a busy host makes fewer.
            down = made[0]
            await wait_for_condition(lambda: made[0] > down, "a beat made while down")
            heard = len(beats)
            await wait_for_condition(lambda: made[0] > down + 3, "three beats made while down")
            assert len(beats) == heard
            await node.bus.reconnect()
            await wait_for_condition(lambda: len(beats) > heard, "a beat after reconnecting")
            assert all(b.healthy for b in beats[heard:])
        finally:
            await cluster.stop()

    asyncio.run(scenario())


def test_the_step_bound_grows_to_a_full_step_at_the_measured_speed() -> None:
    """A large model's prompt step on a CPU rightly takes minutes: the node is stuck only past
    three times what a full step (the token budget) takes at its measured per-token speed,
    or the step timeout where that is longer."""
    stats = EngineStats()
    engine: Any = SimpleNamespace(config=SimpleNamespace(max_num_batched_tokens=2048), stats=stats)
    host = EngineHost(engine, lambda outputs: None, step_timeout_s=120.0)  # never started
    assert host.step_bound_s() == 120.0  # nothing measured yet
    stats.note_prompt_step(1, 0.2)  # a decode step says nothing about a full step
    assert host.step_bound_s() == 120.0
    stats.note_prompt_step(512, 0.5)  # a small model: a full step is 2 s
    assert host.step_bound_s() == 120.0
    stats = engine.stats = EngineStats()
    stats.note_prompt_step(512, 46.0)  # an 8B model on 2 cores: 0.09 s a token
    assert host.step_bound_s() == pytest.approx(FULL_STEP_MARGIN * 2048 * 46.0 / 512)
