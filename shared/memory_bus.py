"""An in-process ``Bus``: NATS's subjects, wildcards, queue groups and request/reply without a
server, for fast tests of services' adapters. Messages are encoded and decoded on the way, so
a message a real bus would refuse is refused here too."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from shared import tracing
from shared.bus import BusRequestError, Handler, NoResponders
from shared.lifecycle import Tasks
from shared.messages import WireMessage, decode, encode

log = logging.getLogger(__name__)
M = TypeVar("M", bound=WireMessage)
R = TypeVar("R", bound=WireMessage)
Deliver = Callable[[str, bytes, "asyncio.Future[bytes] | None"], Awaitable[None]]


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS matching: ``*`` is one token, a final ``>`` is one or more."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


@dataclass(slots=True)
class _Sub:
    """One subscription: its own queue and task, so it sees messages in publish order."""

    pattern: str
    queue_group: str
    deliver: Deliver
    inbox: asyncio.Queue[tuple[str, bytes, asyncio.Future[bytes] | None]] = field(
        default_factory=asyncio.Queue
    )
    task: asyncio.Task[None] | None = None
    closed: bool = False


class MemorySubscription:
    def __init__(self, broker: MemoryBroker, sub: _Sub) -> None:
        self._broker = broker
        self._sub = sub

    async def unsubscribe(self) -> None:
        self._broker.remove(self._sub)


class MemoryBroker:
    """The shared "server" of several ``MemoryBus`` clients.

    Owns the subscriptions. Invariant: a message goes to every plain subscription whose pattern
    matches and to one member of each matching queue group, in publish order per subscription.
    ``drop`` (a test hook) can lose chosen messages on the way, as a restarting server would.
    """

    def __init__(self) -> None:
        self.subs: list[_Sub] = []
        self.drop: Callable[[str, bytes], bool] | None = None
        self._turn = itertools.count()
        self._pumps = Tasks("memory broker")

    def add(self, sub: _Sub) -> None:
        sub.task = self._pumps.spawn(self._pump(sub), f"pump {sub.pattern}")
        self.subs.append(sub)

    def remove(self, sub: _Sub) -> None:
        sub.closed = True
        if sub in self.subs:
            self.subs.remove(sub)
        if sub.task is not None:
            sub.task.cancel()

    def targets(self, subject: str) -> list[_Sub]:
        matching = [s for s in self.subs if subject_matches(s.pattern, subject)]
        plain = [s for s in matching if not s.queue_group]
        groups: dict[str, list[_Sub]] = {}
        for s in matching:
            if s.queue_group:
                groups.setdefault(s.queue_group, []).append(s)
        turn = next(self._turn)
        return plain + [members[turn % len(members)] for members in groups.values()]

    def send(self, subject: str, data: bytes, reply: asyncio.Future[bytes] | None) -> int:
        if self.drop is not None and self.drop(subject, data):
            return 1  # lost on the way: the sender cannot tell
        targets = self.targets(subject)
        for sub in targets:
            sub.inbox.put_nowait((subject, data, reply))
        return len(targets)

    async def _pump(self, sub: _Sub) -> None:
        while not sub.closed:
            subject, data, reply = await sub.inbox.get()
            try:
                await sub.deliver(subject, data, reply)
            except Exception:
                log.exception("handler for %s failed", subject)


class MemoryBus:
    """One client of a ``MemoryBroker``; implements ``shared.bus.Bus``. ``connected`` can be
    set False by a test to play a lost connection (publishes then raise)."""

    def __init__(self, broker: MemoryBroker | None = None) -> None:
        self.broker = broker or MemoryBroker()
        self.connected = True
        self.published: list[tuple[str, WireMessage]] = []
        self._reconnect_callbacks: list[Callable[[], Awaitable[None]]] = []
        self._subs: list[_Sub] = []

    def client(self) -> MemoryBus:
        """Another client of the same broker (another process, as it were)."""
        return MemoryBus(self.broker)

    async def publish(self, subject: str, message: WireMessage) -> None:
        self._check_connected()
        tracing.stamp(message)
        self.published.append((subject, message))
        self.broker.send(subject, encode(message), None)

    async def subscribe(
        self, subject: str, kind: type[M], handler: Handler[M], queue: str = ""
    ) -> MemorySubscription:
        async def deliver(subj: str, data: bytes, reply: asyncio.Future[bytes] | None) -> None:
            message = self._decode(subj, data, kind)
            if message is not None:
                with tracing.delivery(message, subj):
                    await handler(message)

        return self._add(subject, queue, deliver)

    async def watch(
        self, subject: str, kind: type[M], handler: Callable[[str, M], Awaitable[Any]]
    ) -> MemorySubscription:
        async def deliver(subj: str, data: bytes, reply: asyncio.Future[bytes] | None) -> None:
            message = self._decode(subj, data, kind)
            if message is not None:
                with tracing.delivery(message, subj):
                    await handler(subj, message)

        return self._add(subject, "", deliver)

    async def subscribe_raw(
        self, subject: str, handler: Callable[[bytes], Awaitable[Any]]
    ) -> MemorySubscription:
        async def deliver(subj: str, data: bytes, reply: asyncio.Future[bytes] | None) -> None:
            await handler(data)

        return self._add(subject, "", deliver)

    async def publish_raw(self, subject: str, data: bytes) -> None:
        """Test hook: a message that is not Crescent's (say, a server advisory)."""
        self.broker.send(subject, data, None)

    async def request(
        self, subject: str, message: WireMessage, reply_kind: type[R], timeout_s: float
    ) -> R:
        self._check_connected()
        tracing.stamp(message)
        self.published.append((subject, message))
        reply: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if self.broker.send(subject, encode(message), reply) == 0:
            raise NoResponders(f"nobody answers on {subject}")
        try:
            data = await asyncio.wait_for(reply, timeout_s)
            return decode(data, reply_kind)
        except TimeoutError as exc:
            raise BusRequestError(f"no reply on {subject}: timed out") from exc
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise BusRequestError(f"malformed reply on {subject}: {exc}") from exc

    async def serve(
        self,
        subject: str,
        kind: type[M],
        handler: Callable[[M], Awaitable[WireMessage | None]],
        queue: str = "",
    ) -> MemorySubscription:
        async def deliver(subj: str, data: bytes, reply: asyncio.Future[bytes] | None) -> None:
            message = self._decode(subj, data, kind)
            if message is None:
                return
            with tracing.delivery(message, subj):
                answer = await handler(message)
            if answer is not None and reply is not None and not reply.done():
                reply.set_result(encode(answer))

        return self._add(subject, queue, deliver)

    def on_reconnect(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._reconnect_callbacks.append(callback)

    async def reconnect(self) -> None:
        """Test hook: the connection is back; runs the reconnect callbacks."""
        self.connected = True
        for callback in self._reconnect_callbacks:
            await callback()

    async def flush(self) -> None:
        await asyncio.sleep(0)

    async def close(self) -> None:
        for sub in self._subs:
            self.broker.remove(sub)
        self._subs.clear()
        self.connected = False

    def sent(self, subject: str) -> list[Any]:
        """Messages this client published (or requested) on ``subject``, in order."""
        return [m for s, m in self.published if s == subject]

    async def settle(self, rounds: int = 20) -> None:
        """Lets queued deliveries run (tests call it instead of sleeping)."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    def _add(self, subject: str, queue: str, deliver: Deliver) -> MemorySubscription:
        sub = _Sub(subject, queue, deliver)
        self.broker.add(sub)
        self._subs.append(sub)
        return MemorySubscription(self.broker, sub)

    def _check_connected(self) -> None:
        if not self.connected:
            raise ConnectionError("the memory bus is disconnected")

    @staticmethod
    def _decode(subject: str, data: bytes, kind: type[M]) -> M | None:
        try:
            return decode(data, kind)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            log.warning("dropped a malformed %s on %s: %s", kind.__name__, subject, exc)
            return None
