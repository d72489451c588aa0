"""tierd's periodic work as lifecycle ticks: the catalogue heartbeat rides out an unreachable
cachemeta and resyncs after it; a tick that fails otherwise is logged and counted and the
schedule goes on (the next heartbeat resyncs, the next sink round asks the nodes again)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from services.tierd.catalogue import TierCatalogue
from services.tierd.sinker import Sinker, SinkPolicy
from shared import subjects
from shared.cluster_messages import NodeStatus
from shared.lifecycle import Lifecycle
from shared.rpc.client import CacheMetaUnavailable
from shared.rpc.types import BlockRecord, TierCapacity

TICK_S = 0.01


class FakeCacheMeta:
    """Answers the catalogue session's calls; ``failure`` is raised by the next heartbeats."""

    def __init__(self) -> None:
        self.failure: Exception | None = None
        self.beats = 0
        self.replaced: list[str] = []

    async def heartbeat(
        self, node_id: str, role: str, epoch: str, tiers: Sequence[TierCapacity] = ()
    ) -> bool:
        self.beats += 1
        if self.failure is not None:
            raise self.failure
        return False

    async def register_blocks(
        self, node_id: str, tier: str, blocks: Sequence[BlockRecord], *, replace: bool = False
    ) -> int:
        assert replace
        self.replaced.append(tier)
        return len(blocks)


def catalogue_of(client: FakeCacheMeta) -> TierCatalogue:
    fake: Any = client
    return TierCatalogue(fake, "tierd-1", lambda tier: [], lambda: [], ["nvme"], TICK_S)


def test_an_unreachable_cachemeta_is_logged_once_and_resynced_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FakeCacheMeta()
    catalogue = catalogue_of(client)

    async def scenario() -> None:
        await catalogue.tick()
        assert catalogue.in_step and client.replaced == ["nvme"]
        client.failure = CacheMetaUnavailable("cachemeta is away")
        await catalogue.tick()
        await catalogue.tick()
        assert not catalogue.in_step
        client.failure = None
        await catalogue.tick()
        assert catalogue.in_step and client.replaced == ["nvme", "nvme"]

    with caplog.at_level(logging.INFO, logger="services.tierd.catalogue"):
        asyncio.run(scenario())
    assert caplog.text.count("cachemeta unreachable") == 1
    assert caplog.text.count("cachemeta is reachable again") == 1


def test_a_heartbeat_that_breaks_is_counted_and_the_next_one_resyncs() -> None:
    client = FakeCacheMeta()
    catalogue = catalogue_of(client)

    async def scenario() -> Lifecycle:
        life = Lifecycle("tierd")
        life.every("catalogue", TICK_S, catalogue.tick)
        await life.start()
        await until(lambda: catalogue.in_step)
        client.failure = RuntimeError("a bug in the heartbeat")
        await until(lambda: life.failures["catalogue"] >= 2)
        assert not catalogue.in_step
        client.failure = None
        await until(lambda: catalogue.in_step)
        await life.stop()
        return life

    life = asyncio.run(scenario())
    assert life.failures["catalogue"] >= 2
    assert client.replaced.count("nvme") == 2


class RefusingBus:
    """A bus on which every sink request fails with ``failure``."""

    def __init__(self, failure: Exception) -> None:
        self.failure = failure
        self.asked: list[str] = []

    async def request(self, subject: str, message: object, kind: type, timeout_s: float) -> Any:
        self.asked.append(subject)
        raise self.failure


def test_a_sink_round_that_fails_is_counted_and_the_rounds_go_on() -> None:
    bus = RefusingBus(RuntimeError("the bus broke"))
    fake_bus: Any = bus
    unused: Any = None  # no offer comes, so nothing is pulled, checked or stored
    sinker = Sinker(fake_bus, unused, "host-1", "epoch", SinkPolicy(interval_s=TICK_S), unused)

    async def scenario() -> Lifecycle:
        status = NodeStatus(node_id="p1", role="prefill", host_id="host-1", unsunk_blocks=4)
        await sinker.on_heartbeat(subjects.heartbeats("prefill", "p1"), status)
        life = Lifecycle("tierd")
        life.every("sinker", sinker.policy.interval_s, sinker.sink_round)
        await life.start()
        await until(lambda: life.failures["sinker"] >= 3)
        await life.stop()
        return life

    life = asyncio.run(scenario())
    assert bus.asked[:3] == [subjects.sinks("p1")] * 3
    assert life.failures["sinker"] == len(bus.asked)


async def until(check: Any, timeout_s: float = 2.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(TICK_S / 2)  # poll interval until the deadline
