"""``Upkeep`` on its own, over a node's serving parts and stand-in gateways on the in-memory
bus: it aborts a request past its deadline, one its gateway says it does not know, every
request of a gateway nobody serves, and those of a gateway that missed two checks running;
nothing else."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from shared import subjects
from shared.memory_bus import MemoryBus
from shared.messages import GatewayCheck, GatewayCheckReply
from shared.node import upkeep as upkeep_module
from shared.node.requests import NodeRequest, Stage
from shared.node.serving import NodeServing
from shared.node.upkeep import MAX_MISSED_CHECKS, Upkeep
from tests.engine.conftest import EngineFactory
from tests.node.parts.rig import serving_node

Scenario = Callable[[NodeServing, MemoryBus], Awaitable[None]]


def run(make_engine: EngineFactory, scenario: Scenario) -> None:
    async def main() -> None:
        bus = MemoryBus()
        try:
            async with serving_node(make_engine(), bus.client()) as node:
                await scenario(node, bus)
        finally:
            await bus.close()

    asyncio.run(main())


def accept(node: NodeServing, request_id: str, gateway: str = "", deadline: float = 0.0) -> None:
    node.requests.accept(NodeRequest(request_id, gateway, deadline, 0))


def aborted(node: NodeServing, request_id: str) -> bool:
    request = node.requests.get(request_id)
    assert request is not None
    return request.stage is Stage.DONE and request.finish_reason == "abort"


async def gateway(bus: MemoryBus, gateway_id: str, unknown: list[str]) -> None:
    """A stand-in gateway that says it no longer waits for ``unknown``."""

    async def answer(check: GatewayCheck) -> GatewayCheckReply:
        return GatewayCheckReply(unknown=unknown)

    await bus.serve(subjects.gateway_checks(gateway_id), GatewayCheck, answer)


async def gateway_answering_after(bus: MemoryBus, gateway_id: str, when: asyncio.Event) -> None:
    """A stand-in gateway that answers no check until ``when`` is set."""

    async def answer(check: GatewayCheck) -> GatewayCheckReply:
        await when.wait()
        return GatewayCheckReply(unknown=[])

    await bus.serve(subjects.gateway_checks(gateway_id), GatewayCheck, answer)


def test_a_request_past_its_deadline_is_aborted(make_engine: EngineFactory) -> None:
    async def scenario(node: NodeServing, bus: MemoryBus) -> None:
        accept(node, "late", deadline=time.time() - 1.0)
        accept(node, "timely", deadline=time.time() + 3600.0)
        accept(node, "open-ended")
        await Upkeep(node).tick()
        assert aborted(node, "late")
        assert node.requests.active_ids() == ["timely", "open-ended"]

    run(make_engine, scenario)


def test_a_request_its_gateway_forgot_is_aborted(make_engine: EngineFactory) -> None:
    async def scenario(node: NodeServing, bus: MemoryBus) -> None:
        # "theirs" is another gateway's: naming it in a reply must not stop it.
        await gateway(bus, "gw", ["forgotten", "theirs"])
        await gateway(bus, "gw-other", [])
        for rid in ("wanted", "forgotten"):
            accept(node, rid, "gw")
        accept(node, "theirs", "gw-other")
        await Upkeep(node).check_gateways()
        assert aborted(node, "forgotten")
        assert sorted(node.requests.active_ids()) == ["theirs", "wanted"]

    run(make_engine, scenario)


def test_a_gateway_nobody_serves_loses_all_its_requests_at_once(
    make_engine: EngineFactory,
) -> None:
    async def scenario(node: NodeServing, bus: MemoryBus) -> None:
        await gateway(bus, "gw", [])
        for rid in ("a", "b"):
            accept(node, rid, "gw-gone")
        accept(node, "c", "gw")
        await Upkeep(node).check_gateways()
        assert aborted(node, "a") and aborted(node, "b")
        assert node.requests.active_ids() == ["c"]

    run(make_engine, scenario)


def test_a_gateway_that_misses_two_checks_running_loses_its_requests(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep_module, "CHECK_TIMEOUT_S", 0.2)

    async def scenario(node: NodeServing, bus: MemoryBus) -> None:
        answering = asyncio.Event()
        await gateway_answering_after(bus, "gw", answering)
        accept(node, "a", "gw")
        upkeep = Upkeep(node)
        try:
            await upkeep.check_gateways()
            assert upkeep.missed == {"gw": 1}
            answering.set()  # an answer in between clears the count
            await upkeep.check_gateways()
            assert upkeep.missed == {}
            answering.clear()
            for missed in range(1, MAX_MISSED_CHECKS):
                await upkeep.check_gateways()
                assert upkeep.missed == {"gw": missed}
                assert node.requests.active_ids() == ["a"]
            await upkeep.check_gateways()
            assert aborted(node, "a")
            assert upkeep.missed == {}
        finally:
            answering.set()

    run(make_engine, scenario)
