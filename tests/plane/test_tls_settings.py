"""``shared.tls``'s rule for links in clear, through each link's own entry point: by default
(``auto``, no certificate) a NATS URL, a cachemeta target, a TCP pull peer or a listening
address beyond loopback is refused before anything is dialled or bound; ``CRESCENT_TLS=off``
allows it on purpose; half-given TLS files are refused at start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pydantic
import pytest

from shared.bus import NatsBus
from shared.rpc.client import CacheMetaClient
from shared.tls import (
    PlaintextRefused,
    TlsSettings,
    is_loopback,
    summary,
    target_host,
    url_host,
)
from shared.transfer.base import TransferError
from shared.transfer.tcp import TcpTransferServer
from shared.transfer.tcp_client import TcpTransferClient
from tests.support.tls import CertSet

AUTO = TlsSettings(tls="auto")
OFF = TlsSettings(tls="off")
# TEST-NET-1: never routed, so nothing could answer even if a dial slipped through.
FAR = "192.0.2.10"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
        ("localhost", True), ("api.localhost", True), ("0.0.0.0", False), ("::", False),
        (FAR, False), ("nats", False), ("localhost.example.com", False), ("", False),
    ],
)  # fmt: skip
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_hosts_are_read_from_urls_and_targets() -> None:
    assert url_host("nats://nats:4222") == "nats"
    assert url_host("tls://[::1]:4222") == "::1"
    assert url_host("127.0.0.1:4222") == "127.0.0.1"
    assert target_host("cachemeta:50051") == "cachemeta"
    assert target_host("dns:///cachemeta.internal:50051") == "cachemeta.internal"
    assert target_host("[::1]:50051") == "::1"


def test_nats_beyond_loopback_is_refused_in_clear() -> None:
    with pytest.raises(PlaintextRefused, match="CRESCENT_TLS=off"):
        asyncio.run(asyncio.wait_for(NatsBus.connect(f"nats://{FAR}:4222", "t", tls=AUTO), 5))


def test_cachemeta_beyond_loopback_is_refused_in_clear_unless_allowed() -> None:
    with pytest.raises(PlaintextRefused):
        CacheMetaClient("cachemeta:50051", tls=AUTO)
    CacheMetaClient("cachemeta:50051", tls=OFF)  # the operator's explicit choice
    CacheMetaClient("127.0.0.1:50051", tls=AUTO)


def test_a_pull_beyond_loopback_is_refused_in_clear() -> None:
    async def scenario() -> None:
        client = TcpTransferClient(tls=AUTO)
        dest = [np.zeros(16, dtype=np.uint8)]
        try:
            with pytest.raises(TransferError, match="CRESCENT_TLS=off"):
                await client.pull(f"tcp:{FAR}:9".encode(), "lease", [0], dest, timeout_s=5)
        finally:
            await client.close()

    asyncio.run(scenario())


def test_a_transfer_port_beyond_loopback_is_refused_in_clear_unless_allowed() -> None:
    async def scenario() -> None:
        with pytest.raises(PlaintextRefused):
            await TcpTransferServer(lambda lease, ids: None, "0.0.0.0", tls=AUTO).start()
        server = TcpTransferServer(lambda lease, ids: None, "0.0.0.0", tls=OFF)
        await server.start()
        await server.close()

    asyncio.run(scenario())


def test_the_environment_turns_tls_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("CRESCENT_TLS", "CRESCENT_TLS_CA_FILE", "CRESCENT_TLS_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert not TlsSettings().enabled
    files = CertSet.make(tmp_path).ours
    for name, value in files.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CRESCENT_TLS", "auto")  # certificates alone are enough
    settings = TlsSettings()
    assert settings.enabled
    assert settings.client_context("a link", FAR) is not None


@pytest.mark.parametrize(
    "given",
    [
        {"tls": "on"},
        {"tls_cert_file": "cert.pem", "tls_key_file": "key.pem"},
        {"tls_ca_file": "missing.pem", "tls_cert_file": "missing.pem", "tls_key_file": "x"},
    ],
)
def test_incomplete_tls_files_are_refused(given: dict[str, str]) -> None:
    with pytest.raises(pydantic.ValidationError, match="CRESCENT_TLS"):
        TlsSettings(**given)  # type: ignore[arg-type]


def test_the_launchers_line_says_how_the_links_travel(tmp_path: Path) -> None:
    assert "clear on loopback" in summary(AUTO)
    assert "CRESCENT_TLS=off" in summary(OFF)
    assert "mutual TLS" in summary(CertSet.make(tmp_path).good())
