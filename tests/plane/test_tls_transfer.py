"""KV pulls over TCP with TLS on, against a real server on loopback: the deployment's
certificate pulls blocks intact; a client in clear, one with another CA's certificate, one
with no certificate, and one that trusts another CA are all refused before a block leaves."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shared.tls import TlsSettings
from shared.transfer.base import TransferError
from shared.transfer.tcp import TcpTransferServer, decode_address
from shared.transfer.tcp_client import TcpTransferClient
from tests.support.tls import CertSet

BLOCK_BYTES = 1_474_560  # a 32-token block of SmolLM2's fp32 KV
LEASE = "lease-1"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return CertSet.make(Path(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module")
def run() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as runner:
        yield runner


def blocks(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, BLOCK_BYTES, dtype=np.uint8) for _ in range(count)]


async def serving(certs: CertSet, pool: list[np.ndarray]) -> TcpTransferServer:
    def provide(lease: str, ids: object) -> list[np.ndarray] | None:
        return [pool[i] for i in ids] if lease == LEASE else None  # type: ignore[attr-defined]

    server = TcpTransferServer(provide, "127.0.0.1", tls=certs.good())
    await server.start()
    return server


async def pull(server: TcpTransferServer, tls: TlsSettings, count: int) -> list[np.ndarray]:
    dest = [np.zeros(BLOCK_BYTES, dtype=np.uint8) for _ in range(count)]
    client = TcpTransferClient(timeout_s=10.0, tls=tls)
    try:
        await client.pull(server.address, LEASE, list(range(count)), dest)
    finally:
        await client.close()
    return dest


def test_the_deployments_certificate_pulls_blocks_intact(
    run: asyncio.Runner, certs: CertSet
) -> None:
    pool = blocks(3)

    async def scenario() -> None:
        server = await serving(certs, pool)
        client = TcpTransferClient(timeout_s=10.0, tls=certs.good())
        try:
            for count in (1, 3):  # the second pull reuses the first one's connection
                dest = [np.zeros(BLOCK_BYTES, dtype=np.uint8) for _ in range(count)]
                await client.pull(server.address, LEASE, list(range(count)), dest)
                for got, want in zip(dest, pool, strict=False):
                    assert np.array_equal(got, want)
            assert server.connections == 1
            assert server.blocks_sent == 4
        finally:
            await client.close()
            await server.close()

    run.run(scenario())


@pytest.mark.parametrize(
    ("who", "reason"),
    [
        ("clear", "peer gone"),  # the server hangs up on bytes that are not TLS
        ("foreign_cert", "unknown ca"),  # the server refuses the client's certificate
        ("foreign_ca", "certificate verify failed"),  # the client refuses the server's
    ],
)
def test_a_client_without_the_deployments_trust_gets_no_block(
    run: asyncio.Runner, certs: CertSet, who: str, reason: str
) -> None:
    async def scenario() -> None:
        server = await serving(certs, blocks(1))
        try:
            with pytest.raises(TransferError, match=reason):
                await pull(server, getattr(certs, who)(), 1)
            assert server.blocks_sent == 0
        finally:
            await server.close()

    run.run(scenario())


def test_a_client_with_no_certificate_is_refused(run: asyncio.Runner, certs: CertSet) -> None:
    """TLS that checks the server but presents nothing: mutual TLS turns it away."""

    async def scenario() -> None:
        server = await serving(certs, blocks(1))
        host, port = decode_address(server.address)
        context = ssl.create_default_context(cafile=str(certs.ours.ca))
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=context)
            writer.write(b"CKVT" + bytes(60))
            # TLS 1.3 ends the handshake on the client's side before the server has checked
            # the client: the refusal arrives as an alert, or as the connection closing.
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                await asyncio.wait_for(reader.readexactly(1), 10)
            writer.close()
            assert server.blocks_sent == 0
        finally:
            await server.close()

    run.run(scenario())


def test_a_handshake_never_finished_is_dropped_at_the_read_deadline(
    run: asyncio.Runner, certs: CertSet
) -> None:
    """A connection that never completes its handshake frees its slot as a slow request does,
    not after the much longer idle timeout."""

    async def scenario() -> None:
        server = TcpTransferServer(
            lambda lease, ids: None, "127.0.0.1", tls=certs.good(), read_timeout_s=0.4
        )
        await server.start()
        host, port = decode_address(server.address)
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"\x16\x03\x01")  # the first bytes of a ClientHello, and no more
            # The server closes it: end of stream, well before the idle timeout (60 s).
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
        finally:
            await server.close()

    run.run(scenario())
