"""A real nats-server with the generated users and permissions, and clients that connect as
one of them and record what the server refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.support.nats import NatsServer
from tests.support.wait import DEFAULT_TIMEOUT_S, holds_within

#: The deployment the tests' server knows: one NATS user per instance, named by its node id.
NODES = {
    "gateway-0": "gateway",
    "scheduler-0": "scheduler",
    "prefill-0": "prefill",
    "prefill-1": "prefill",
    "decode-0": "decode",
    "decode-1": "decode",
    "tierd-host": "tierd",
    "kvindex": "kvindex",
}
#: Who a test means by a role's name: that role's first instance.
AS_ROLE = {role: next(n for n, r in NODES.items() if r == role) for role in set(NODES.values())}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    directory = Path(tmp_path_factory.mktemp("nats"))
    nats_server = NatsServer.start(directory, auth=True, nodes=NODES)
    try:
        yield nats_server
    finally:
        nats_server.stop()


@dataclass
class Conn:
    """One client connection and the errors the server sent it."""

    nc: Client
    errors: list[str] = field(default_factory=list)

    async def sync(self) -> None:
        """Returns once the server has processed everything sent before. nats-py writes a
        flush's PING ahead of commands still buffered, so one flush can return before a
        subscription reached the server; by the second, the buffer has been written."""
        await self.nc.flush()
        await self.nc.flush()

    async def refused(self, subject: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        """Whether the server reported a permissions violation naming ``subject`` within
        ``timeout_s`` (short where the test expects none)."""
        await self.sync()
        subject = subject.lower()
        return await holds_within(
            lambda: any("permissions violation" in e and subject in e for e in self.errors),
            timeout_s,
        )


@asynccontextmanager
async def connect(server: NatsServer, user: str, name: str | None = None) -> AsyncIterator[Conn]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc).lower())

    user = AS_ROLE.get(user, user)
    nc = await nats.connect(
        server.url,
        name=name or f"test-{user}",
        error_cb=on_error,
        allow_reconnect=False,
        **server.connect_options(user),
    )
    try:
        yield Conn(nc, errors)
    finally:
        await nc.close()


async def received(
    messages: Sequence[object], count: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """Whether ``count`` messages arrived within ``timeout_s`` (short where none should)."""
    return await holds_within(lambda: len(messages) >= count, timeout_s)


async def deliver(
    server: NatsServer, sender: str, receiver: str, subject: str, allowed: bool
) -> tuple[bool, bool]:
    """Publishes once on ``subject`` as ``sender`` while ``receiver`` listens there: whether
    it arrived, and whether the server refused it. The slow wait is on the expected outcome."""
    async with connect(server, receiver) as listener, connect(server, sender) as talker:
        arrived: list[str] = []

        async def on_message(msg: Msg) -> None:
            arrived.append(msg.subject)

        await listener.nc.subscribe(subject, cb=on_message)
        await listener.sync()
        assert not listener.errors, f"{receiver} may not listen on {subject}"
        await talker.nc.publish(subject, b"{}")
        # Long where the event should come (a busy host is slow), short where it should not.
        got = await received(arrived, timeout_s=DEFAULT_TIMEOUT_S if allowed else 0.3)
        refused = await talker.refused(subject, timeout_s=0.3 if allowed else DEFAULT_TIMEOUT_S)
        return got, refused
