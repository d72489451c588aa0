"""A service's heartbeat as a lifecycle tick: a slow status is replaced by the fallback, which
says the node is unhealthy; nothing is published while the bus is down; a failed beat is
counted and the next one is still sent."""

from __future__ import annotations

import asyncio
from typing import Any

from shared import subjects
from shared.cluster_messages import NodeStatus
from shared.heartbeat import Heartbeat
from shared.lifecycle import Lifecycle

INTERVAL_S = 0.02


class Wire:
    """Records what is published; fails the first ``failures`` publishes."""

    def __init__(self, failures: int = 0) -> None:
        self.connected = True
        self.failures = failures
        self.sent: list[tuple[str, NodeStatus]] = []
        self.arrived = asyncio.Event()

    async def publish(self, subject: str, message: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the bus dropped it")
        self.sent.append((subject, message))
        self.arrived.set()


def bare() -> NodeStatus:
    return NodeStatus(node_id="n1", role="decode", epoch="e")


def test_a_slow_status_is_replaced_by_an_unhealthy_fallback() -> None:
    async def scenario() -> list[tuple[str, NodeStatus]]:
        wire = Wire()

        async def slow() -> NodeStatus:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        await Heartbeat(wire, INTERVAL_S, slow, bare).beat()  # type: ignore[arg-type]
        return wire.sent

    [(subject, beat)] = asyncio.run(scenario())
    assert subject == subjects.heartbeats("decode", "n1")
    assert not beat.healthy and beat.ts > 0


def test_nothing_is_sent_while_the_bus_is_down() -> None:
    async def scenario() -> list[tuple[str, NodeStatus]]:
        wire = Wire()
        wire.connected = False

        async def status() -> NodeStatus:
            return bare()

        await Heartbeat(wire, INTERVAL_S, status, bare).beat()  # type: ignore[arg-type]
        return wire.sent

    assert asyncio.run(scenario()) == []


def test_a_failed_beat_is_counted_and_the_next_one_sent() -> None:
    async def scenario() -> tuple[int, int]:
        wire = Wire(failures=2)

        async def status() -> NodeStatus:
            return bare()

        life = Lifecycle("decode")
        heart = Heartbeat(wire, INTERVAL_S, status, bare)  # type: ignore[arg-type]
        life.every("heartbeat", INTERVAL_S, heart.beat)
        await life.start()
        await asyncio.wait_for(wire.arrived.wait(), 5.0)
        await life.stop()
        return life.failures["heartbeat"], len(wire.sent)

    failures, sent = asyncio.run(scenario())
    assert failures == 2 and sent >= 1
