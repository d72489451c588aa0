"""The in-memory bus behaves like NATS where services rely on it."""

from __future__ import annotations

import asyncio

import pytest

from shared.bus import BusRequestError, NoResponders
from shared.memory_bus import MemoryBus, subject_matches
from shared.messages import AbortRequest, GatewayCheck, GatewayCheckReply


def test_subject_matching_follows_nats() -> None:
    assert subject_matches("a.*.c", "a.b.c") and not subject_matches("a.*", "a.b.c")
    assert subject_matches("a.>", "a.b.c") and not subject_matches("a.>", "a")
    assert not subject_matches("a.b", "a.b.c") and subject_matches("a.b", "a.b")


def test_queue_groups_share_and_plain_subscribers_all_hear() -> None:
    async def scenario() -> tuple[list[str], list[str], list[str]]:
        bus = MemoryBus()
        heard: tuple[list[str], list[str], list[str]] = ([], [], [])
        for i, queue in enumerate(("q", "q", "")):
            box = heard[i]

            async def on(message: AbortRequest, box: list[str] = box) -> None:
                box.append(message.request_id)

            await bus.client().subscribe("x.y", AbortRequest, on, queue=queue)
        for i in range(4):
            await bus.publish("x.y", AbortRequest(request_id=f"r{i}"))
        await bus.settle()
        return heard

    first, second, plain = asyncio.run(scenario())
    assert sorted(first + second) == ["r0", "r1", "r2", "r3"] and first and second
    assert plain == ["r0", "r1", "r2", "r3"]


def test_request_reply_no_responders_timeouts_and_malformed_messages() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        ask = GatewayCheck(request_ids=["a"])
        with pytest.raises(NoResponders):
            await bus.request("s", ask, GatewayCheckReply, 1.0)

        async def answer(check: GatewayCheck) -> GatewayCheckReply | None:
            return None if check.request_ids == ["quiet"] else GatewayCheckReply(unknown=["a"])

        await bus.client().serve("s", GatewayCheck, answer)
        assert (await bus.request("s", ask, GatewayCheckReply, 1.0)).unknown == ["a"]
        with pytest.raises(BusRequestError):
            await bus.request("s", GatewayCheck(request_ids=["quiet"]), GatewayCheckReply, 0.05)
        # A value a real bus refuses (an id with a dot) is dropped on the way in.
        with pytest.raises(BusRequestError):
            await bus.request("s", GatewayCheck(request_ids=["a.b"]), GatewayCheckReply, 0.05)

    asyncio.run(scenario())
