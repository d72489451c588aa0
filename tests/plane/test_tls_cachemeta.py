"""cachemeta's gRPC port with TLS on, the real service in its own process on loopback: the
deployment's certificate with the token is served; the token is still required over TLS; a
client in clear, one presenting another CA's certificate and one trusting another CA get no
answer. In clear, the service refuses to open a port beyond loopback."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.rpc.client import CacheMetaClient, CacheMetaError, CacheMetaUnavailable
from shared.tls import TlsSettings
from tests.support.nats import free_port, wait_for_port
from tests.support.tls import CertSet

TOKEN = "tls-test-token-0123456789"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertSet:
    return CertSet.make(Path(tmp_path_factory.mktemp("tls")))


def cachemeta_env(tmp: Path, host: str, port: int, extra: dict[str, str]) -> dict[str, str]:
    return os.environ | extra | {
        "CRESCENT_DB_URL": f"sqlite+aiosqlite:///{tmp / 'cachemeta.db'}",
        "CRESCENT_CACHEMETA_HOST": host,
        "CRESCENT_CACHEMETA_PORT": str(port),
        "CRESCENT_CACHEMETA_TOKEN": TOKEN,
    }  # fmt: skip


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, certs: CertSet) -> Iterator[str]:
    tmp = Path(tmp_path_factory.mktemp("cachemeta"))
    port = free_port()
    log = (tmp / "cachemeta.log").open("wb")
    env = cachemeta_env(tmp, "127.0.0.1", port, certs.ours.env())
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cachemeta"], env=env, stdout=log, stderr=log
    )
    try:
        wait_for_port(port, 60, proc, "cachemeta")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


async def stats(target: str, tls: TlsSettings, token: str | None = TOKEN) -> int:
    client = CacheMetaClient(target, timeout_s=10, token=token, tls=tls)
    try:
        return (await client.stats()).num_nodes
    finally:
        await client.close()


def test_the_deployments_certificate_with_the_token_is_served(target: str, certs: CertSet) -> None:
    assert asyncio.run(stats(target, certs.good())) == 0


def test_the_token_is_still_required_over_tls(target: str, certs: CertSet) -> None:
    with pytest.raises(CacheMetaError, match="token"):
        asyncio.run(stats(target, certs.good(), token="another-token-0123456789"))


@pytest.mark.parametrize("who", ["clear", "foreign_cert", "foreign_ca"])
def test_a_client_without_the_deployments_trust_gets_no_answer(
    target: str, certs: CertSet, who: str
) -> None:
    with pytest.raises(CacheMetaUnavailable, match="UNAVAILABLE"):
        asyncio.run(stats(target, getattr(certs, who)()))


def test_in_clear_the_service_refuses_a_port_beyond_loopback(tmp_path: Path) -> None:
    env = cachemeta_env(tmp_path, "0.0.0.0", free_port(), {"CRESCENT_TLS": "auto"})
    for name in ("CRESCENT_TLS_CA_FILE", "CRESCENT_TLS_CERT_FILE", "CRESCENT_TLS_KEY_FILE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "services.cachemeta"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "CRESCENT_TLS=off" in done.stdout + done.stderr
