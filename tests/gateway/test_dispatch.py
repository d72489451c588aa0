"""The dispatcher against an in-memory bus: ordering of subscribe and publish, and aborts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from services.gateway.dispatch import Dispatcher
from services.gateway.errors import ApiError
from shared import subjects
from shared.messages import AbortRequest, GenerateRequest, SamplingSpec, TokenChunk, WireMessage


class MemoryBus:
    """Records the calls the dispatcher makes, in order."""

    def __init__(self) -> None:
        self.connected = True
        self.calls: list[tuple[str, str]] = []
        self.handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {}
        self.published: list[tuple[str, WireMessage]] = []

    async def publish(self, subject: str, message: WireMessage) -> None:
        self.calls.append(("pub", subject))
        self.published.append((subject, message))

    async def subscribe(
        self, subject: str, kind: type, handler: Callable[[Any], Awaitable[Any]], queue: str = ""
    ) -> Any:
        self.calls.append(("sub", subject))
        self.handlers[subject] = handler
        bus = self

        class Subscription:
            async def unsubscribe(self) -> None:
                bus.calls.append(("unsub", subject))

        return Subscription()

    def aborted(self) -> list[str]:
        return [m.request_id for s, m in self.published if isinstance(m, AbortRequest)]


def request(request_id: str) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id,
        tenant="t",
        prompt_token_ids=[1],
        sampling=SamplingSpec(max_tokens=4),
    )


def test_subscribes_before_publishing_and_aborts_what_did_not_end() -> None:
    async def scenario(bus: MemoryBus) -> None:
        dispatcher = Dispatcher(bus)
        flight = await dispatcher.open([request("a-0"), request("a-1")])
        await bus.handlers[subjects.tokens("a-0")](
            TokenChunk(request_id="spoofed", index=0, token_ids=[5], finish_reason="stop")
        )
        chunk = await flight.next(1.0)
        assert chunk.request_id == "a-0"  # the subject decides, not the payload
        flight.close()
        flight.close()
        await dispatcher.drain()

    bus = MemoryBus()
    asyncio.run(scenario(bus))
    kinds = [kind for kind, _ in bus.calls]
    assert kinds[:4] == ["sub", "sub", "pub", "pub"]
    assert bus.aborted() == ["a-1"]
    assert sorted(s for k, s in bus.calls if k == "unsub") == [
        subjects.tokens("a-0"),
        subjects.tokens("a-1"),
    ]


def test_finish_aborts_once_and_close_does_not_repeat_it() -> None:
    async def scenario(bus: MemoryBus) -> None:
        dispatcher = Dispatcher(bus)
        flight = await dispatcher.open([request("b-0")])
        flight.finish("b-0")
        flight.finish("b-0")
        flight.close()
        await dispatcher.drain()
        with pytest.raises(TimeoutError):
            await flight.next(0.01)

    bus = MemoryBus()
    asyncio.run(scenario(bus))
    assert bus.aborted() == ["b-0"]


def test_disconnected_bus_is_503() -> None:
    bus = MemoryBus()
    bus.connected = False
    with pytest.raises(ApiError) as info:
        asyncio.run(Dispatcher(bus).open([request("c-0")]))
    assert info.value.status == 503 and bus.calls == []


def test_failed_publish_is_503_and_aborts_what_went_out() -> None:
    class FailingBus(MemoryBus):
        async def publish(self, subject: str, message: WireMessage) -> None:
            if subject == subjects.REQUESTS and len(self.published) == 1:
                raise ConnectionError("gone")
            await super().publish(subject, message)

    async def scenario(bus: MemoryBus) -> None:
        dispatcher = Dispatcher(bus)
        with pytest.raises(ApiError) as info:
            await dispatcher.open([request("d-0"), request("d-1")])
        assert info.value.status == 503
        await dispatcher.drain()

    bus = FailingBus()
    asyncio.run(scenario(bus))
    assert bus.aborted() == ["d-0", "d-1"]
