"""The gateway's hand-off to the scheduler, against the in-memory bus: a submission is
subscribed before it is sent and answered before it counts, a missing or silent scheduler
fails fast or is tried again under a new id, and what did not end is aborted once."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.gateway.dispatch import Dispatcher, SubmitPolicy
from services.gateway.errors import ApiError
from services.gateway.flight import Arrived, Flight
from shared import subjects
from shared.cluster_messages import NodeStatus
from shared.memory_bus import MemoryBus
from shared.messages import (
    QUOTA,
    AbortRequest,
    GatewayCheck,
    GatewayCheckReply,
    GenerateRequest,
    SamplingSpec,
    SubmitReply,
    TokenChunk,
)


def request(request_id: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id,
        tenant="t",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingSpec(max_tokens=4),
        gateway_id="gw",
    )


class Scheduler:
    """Answers submissions: accepts, refuses, or keeps silent for the first ``silent``."""

    def __init__(
        self, bus: MemoryBus, silent: int = 0, refuse: int | None = None, kind: str = ""
    ) -> None:
        self.bus, self.silent, self.refuse, self.kind = bus, silent, refuse, kind
        self.seen: list[str] = []

    async def start(self) -> None:
        await self.bus.serve(subjects.REQUESTS, GenerateRequest, self.on_request, "scheduler")

    async def on_request(self, req: GenerateRequest) -> SubmitReply | None:
        self.seen.append(req.request_id)
        if len(self.seen) <= self.silent:
            return None
        if self.refuse is not None:
            return SubmitReply(accepted=False, error="busy", error_code=self.refuse,
                               retry_after_s=2.0, error_kind=self.kind)  # fmt: skip
        return SubmitReply(accepted=True, prefill_node="p0", prefill_epoch="e0")


def aborted(bus: MemoryBus) -> list[str]:
    return [m.request_id for m in bus.sent(subjects.ABORTS) if isinstance(m, AbortRequest)]


def run(scenario) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(scenario())


def test_a_submission_is_subscribed_first_and_unfinished_choices_are_aborted() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        await Scheduler(bus.client()).start()
        dispatcher = Dispatcher(bus, "gw")
        flight = Flight.of(dispatcher, [request("a-0"), request("a-1")])
        replies = await flight.start()
        assert [r.prefill_node for r in replies] == ["p0", "p0"]
        order = [s for s, _ in bus.published]
        assert order == [subjects.REQUESTS, subjects.REQUESTS]
        assert set(dispatcher.in_flight) == {"a-0", "a-1"}
        await bus.client().publish(
            subjects.tokens("a-0"),
            TokenChunk(request_id="spoofed", index=0, token_ids=[5], finish_reason="stop"),
        )
        event = await flight.next(1.0)
        assert isinstance(event, Arrived) and event.chunk.request_id == "a-0"
        flight.end(0)
        flight.close()
        flight.close()
        await dispatcher.drain()
        assert aborted(bus) == ["a-1"] and dispatcher.in_flight == {}

    run(scenario)


def test_no_scheduler_is_a_503_within_a_second() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        dispatcher = Dispatcher(bus, "gw", submit=SubmitPolicy(no_scheduler_s=0.3))
        flight = Flight.of(dispatcher, [request("b-0")])
        started = time.monotonic()
        with pytest.raises(ApiError) as info:
            await flight.start()
        assert info.value.status == 503 and "No scheduler" in info.value.message
        assert 0.3 <= time.monotonic() - started < 1.0
        flight.close()

    run(scenario)


def test_a_silent_scheduler_is_asked_again_under_a_new_id() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        scheduler = Scheduler(bus.client(), silent=1)
        await scheduler.start()
        dispatcher = Dispatcher(bus, "gw", submit=SubmitPolicy(reply_timeout_s=0.2))
        flight = Flight.of(dispatcher, [request("c-0")])
        await flight.start()
        assert scheduler.seen == ["c-0", "c-0-r1"]
        await dispatcher.drain()
        # The first id may have been placed after all: it is aborted, and no longer wanted.
        assert aborted(bus) == ["c-0"] and set(dispatcher.in_flight) == {"c-0-r1"}
        flight.close()

    run(scenario)


def test_a_refusal_carries_its_status_and_retry_after() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        await Scheduler(bus.client(), refuse=429).start()
        flight = Flight.of(Dispatcher(bus, "gw"), [request("d-0")])
        with pytest.raises(ApiError) as info:
            await flight.start()
        assert info.value.status == 429 and info.value.headers["Retry-After"] == "2"
        flight.close()
        assert aborted(bus) == []  # nothing runs anywhere

    run(scenario)


def test_a_keep_over_quota_is_openais_insufficient_quota_not_to_be_retried() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        await Scheduler(bus.client(), refuse=429, kind=QUOTA).start()
        flight = Flight.of(Dispatcher(bus, "gw"), [request("q-0")])
        with pytest.raises(ApiError) as info:
            await flight.start()
        error = info.value
        assert (error.status, error.type, error.code) == (429, QUOTA, QUOTA)
        assert error.param == "cache_control.keep"
        assert error.headers == {"x-should-retry": "false"}
        flight.close()

    run(scenario)


def test_nodes_hear_which_requests_are_still_wanted() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        await Scheduler(bus.client()).start()
        dispatcher = Dispatcher(bus, "gw")
        await dispatcher.start()
        flight = Flight.of(dispatcher, [request("e-0")])
        await flight.start()
        ask = GatewayCheck(request_ids=["e-0", "gone-0"])
        node = bus.client()
        reply = await node.request(subjects.gateway_checks("gw"), ask, GatewayCheckReply, 1.0)
        assert reply.unknown == ["gone-0"]
        flight.close()
        reply = await node.request(subjects.gateway_checks("gw"), ask, GatewayCheckReply, 1.0)
        assert reply.unknown == ["e-0", "gone-0"]

    run(scenario)


def test_readiness_needs_a_scheduler_and_both_node_roles() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        dispatcher = Dispatcher(bus, "gw")
        await dispatcher.start()
        node = bus.client()
        assert dispatcher.readiness() == (False, "no live scheduler")
        for role, node_id in (("scheduler", "s0"), ("prefill", "p0"), ("decode", "d0")):
            status = NodeStatus(node_id=node_id, role=role, epoch="e")
            await node.publish(subjects.heartbeats(role, node_id), status)
        await bus.settle()
        assert dispatcher.readiness() == (True, "")
        # A heartbeat on another node's subject is forged: it is dropped.
        forged = NodeStatus(node_id="p0", role="prefill", epoch="e", draining=True)
        await node.publish(subjects.heartbeats("prefill", "p9"), forged)
        await bus.settle()
        assert dispatcher.readiness() == (True, "")
        bus.connected = False
        assert dispatcher.readiness() == (False, "not connected to NATS")

    run(scenario)


def test_the_gateway_refuses_by_itself_while_every_scheduler_reports_an_overload() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        dispatcher = Dispatcher(bus, "gw")
        await dispatcher.start()
        node = bus.client()

        async def scheduler_says(node_id: str, floor: float, slo: float) -> None:
            status = NodeStatus(
                node_id=node_id, role="scheduler", epoch="e", ttft_floor_s=floor, ttft_slo_s=slo
            )
            await node.publish(subjects.heartbeats("scheduler", node_id), status)
            await bus.settle()

        assert dispatcher.overloaded() is None
        await scheduler_says("s0", 5.0, 2.0)
        assert dispatcher.overloaded() == 3.0
        await scheduler_says("s1", 1.0, 2.0)  # another replica still sees room: ask it
        assert dispatcher.overloaded() is None
        await scheduler_says("s1", 2.5, 2.0)
        assert dispatcher.overloaded() == 1.0  # at least a second
        await scheduler_says("s1", 0.0, 0.0)  # no objective set: never refuse here
        assert dispatcher.overloaded() is None

    run(scenario)


def test_a_bus_reconnection_reaches_each_flight_once() -> None:
    async def scenario() -> None:
        bus = MemoryBus()
        await Scheduler(bus.client()).start()
        dispatcher = Dispatcher(bus, "gw")
        flight = Flight.of(dispatcher, [request("r-0"), request("r-1")])
        await flight.start()
        assert flight.reconnected_at is None
        # One flight listens under both its choices' ids; flights are not hashable.
        await dispatcher._on_reconnect()
        assert flight.reconnected_at is not None
        flight.close()
        await dispatcher.drain()

    run(scenario)
