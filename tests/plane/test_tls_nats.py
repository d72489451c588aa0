"""NATS with TLS on, against a real nats-server on loopback configured as ``crescent up``
configures it (``crescent.nats_config`` with the TLS files in the environment): the
deployment's certificate connects and exchanges messages; a client in clear, one presenting
another CA's certificate and one trusting another CA are refused."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

from crescent.nats_config import write_nats_auth
from shared import subjects
from shared.bus import NatsBus, tls_options
from shared.messages import WireMessage
from shared.tls import TlsSettings
from tests.support.nats import NatsServer
from tests.support.tls import CertSet

USER = "tools"


class Ping(WireMessage, kw_only=True):
    n: int


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return CertSet.make(Path(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, certs: CertSet) -> Iterator[NatsServer]:
    store = Path(tmp_path_factory.mktemp("nats"))
    with pytest.MonkeyPatch.context() as env:
        for name, value in certs.ours.env().items():
            env.setenv(name, value)
        auth = write_nats_auth(store / "auth", jetstream=False)
    assert "verify: true" in auth.config.read_text()
    nats_server = NatsServer.start(store, jetstream=False, auth=auth)
    try:
        yield nats_server
    finally:
        nats_server.stop()


async def attempt(server: NatsServer, tls: TlsSettings) -> None:
    """One connection that gives up at its first failure."""
    options: dict[str, Any] = tls_options(server.url, tls) | server.connect_options(USER)
    nc = await nats.connect(
        server.url, connect_timeout=3, allow_reconnect=False, max_reconnect_attempts=0, **options
    )
    await nc.flush()
    await nc.close()


def test_the_deployments_certificate_connects_and_delivers(
    server: NatsServer, certs: CertSet
) -> None:
    async def connect(user: str) -> NatsBus:
        options = server.connect_options(user)
        return await NatsBus.connect(server.url, f"tls-{user}", tls=certs.good(), **options)

    async def scenario() -> None:
        sender, receiver = await connect("gateway"), await connect(USER)
        got: asyncio.Future[Ping] = asyncio.get_running_loop().create_future()

        async def on_ping(message: Ping) -> None:
            got.set_result(message)

        try:
            await receiver.subscribe(subjects.HEARTBEATS_ALL, Ping, on_ping)
            # nats-py can write a flush's PING ahead of a buffered SUB: the second flush
            # returns only once the subscription has reached the server.
            await receiver.flush()
            await receiver.flush()
            await sender.publish(subjects.heartbeats("gateway", "g-1"), Ping(n=7))
            assert (await asyncio.wait_for(got, 10)).n == 7
            writer = receiver.nc._transport._io_writer  # type: ignore[union-attr]
            assert writer.get_extra_info("ssl_object").version() == "TLSv1.3"
        finally:
            await sender.close()
            await receiver.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("who", "error", "reason"),
    [
        # Waits for an INFO that a server expecting a handshake never sends in clear.
        ("clear", nats.errors.Error, "expecting INFO"),
        ("foreign_cert", ssl.SSLError, "unknown ca"),  # the server refuses the client
        ("foreign_ca", ssl.SSLError, "certificate verify failed"),  # the client refuses it
    ],
)
def test_a_client_without_the_deployments_trust_is_refused(
    server: NatsServer, certs: CertSet, who: str, error: type[Exception], reason: str
) -> None:
    with pytest.raises(error, match=reason):
        asyncio.run(attempt(server, getattr(certs, who)()))


def test_the_server_says_nothing_in_clear(server: NatsServer) -> None:
    """A client that speaks the protocol in clear gets neither INFO nor PONG: the connection
    is closed unanswered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b'CONNECT {"verbose":false}\r\nPING\r\n')
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    assert b"INFO" not in received and b"PONG" not in received
