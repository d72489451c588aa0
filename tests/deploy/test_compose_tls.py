"""docker-compose.yml runs every internal link over mutual TLS with the files secrets-init
generates: each service's settings (read from its environment, as the service reads them) give
it a certificate, and a handshake of every client with every server it dials succeeds under
the name it checks, NATS, cachemeta, KV pulls between containers and tierd's https S3 alike.
Before the stack had certificates each of these raised ``PlaintextRefused``."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from shared.tls import TlsSettings, target_host, url_host
from tests.deploy.generated import SECRETS_DIR, generate, localized, service_env
from tests.deploy.handshake import PEER_ADDRESS, dial, handshake, nats_server_tls
from tests.deploy.test_compose import rendered

NATS_CLIENTS = ("gateway", "scheduler", "prefill", "decode", "tierd", "kvindex")
CACHEMETA_CLIENTS = ("scheduler", "prefill", "decode", "tierd")
PULL_SERVERS = ("prefill", "decode", "tierd")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    return rendered()["services"], generate(tmp_path_factory.mktemp("stack") / "secrets")


def settings_of(
    stack: tuple[dict[str, Any], Path], name: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[TlsSettings, dict[str, str]]:
    """Service ``name``'s TLS settings, read from its environment as the service does."""
    services, folder = stack
    env = service_env(services[name], folder)
    with monkeypatch.context() as patch:
        for key in list(os.environ):
            if key.startswith("CRESCENT_TLS"):
                patch.delenv(key)
        for key, value in env.items():
            patch.setenv(key, value)
        return TlsSettings(), env


def nats_server(stack: tuple[dict[str, Any], Path]) -> TlsSettings:
    """The NATS container's TLS, from the tls block of the configuration it runs."""
    folder = stack[1]
    config = (folder / "nats-config").read_text()
    return nats_server_tls(config, lambda text: localized(text, folder))


@pytest.mark.parametrize("name", NATS_CLIENTS)
def test_every_service_reaches_nats_over_mutual_tls(
    stack: tuple[dict[str, Any], Path], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls, env = settings_of(stack, name, monkeypatch)
    assert tls.tls == "on" and tls.enabled
    dial(tls, nats_server(stack), "the NATS connection", url_host(env["CRESCENT_NATS_URL"]))


@pytest.mark.parametrize("name", CACHEMETA_CLIENTS)
def test_cachemetas_callers_reach_it_over_mutual_tls(
    stack: tuple[dict[str, Any], Path], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, env = settings_of(stack, name, monkeypatch)
    server, server_env = settings_of(stack, "cachemeta", monkeypatch)
    server.server_context("cachemeta", server_env["CRESCENT_CACHEMETA_HOST"])
    dial(client, server, "cachemeta", target_host(env["CRESCENT_CACHEMETA_URL"]))


@pytest.mark.parametrize("puller", PULL_SERVERS)
@pytest.mark.parametrize("source", PULL_SERVERS)
def test_kv_pulls_between_containers_run_over_mutual_tls(
    stack: tuple[dict[str, Any], Path], puller: str, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, env = settings_of(stack, puller, monkeypatch)
    server, server_env = settings_of(stack, source, monkeypatch)
    assert env["CRESCENT_TRANSFER"] == "tcp"
    server.server_context("KV transfer", server_env["CRESCENT_TRANSFER_HOST"])
    dial(client, server, "KV transfer", PEER_ADDRESS)


def test_a_pull_server_is_checked_by_its_shared_name_not_its_address(
    stack: tuple[dict[str, Any], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _ = settings_of(stack, "decode", monkeypatch)
    server, _ = settings_of(stack, "prefill", monkeypatch)
    near, far = client.client_context("pull", PEER_ADDRESS), server.server_context("pull", "")
    assert near is not None and far is not None
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(near, far, PEER_ADDRESS)
    # The gateway's certificate serves nothing: it does not carry the pull servers' name.
    gateway, _ = settings_of(stack, "gateway", monkeypatch)
    impostor = gateway.server_context("pull", "")
    assert impostor is not None
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(near, impostor, client.tls_server_name or PEER_ADDRESS)


def test_tierd_reaches_the_stacks_s3_over_verified_https(
    stack: tuple[dict[str, Any], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    services, folder = stack
    _, env = settings_of(stack, "tierd", monkeypatch)
    endpoint = urlsplit(env["CRESCENT_S3_ENDPOINT"])
    assert endpoint.scheme == "https" and env["CRESCENT_S3_ALLOW_HTTP"] == "false"
    flags = dict(word.split("=", 1) for word in services["s3"]["command"] if "=" in str(word))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert, key = (localized(flags[f"-s3.{k}.file"], folder) for k in ("cert", "key"))
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=env["CRESCENT_S3_CA_BUNDLE"])
    handshake(client, server, endpoint.hostname or "")
    assert env["CRESCENT_S3_CA_BUNDLE"].startswith(str(folder))
    assert flags["-s3.cert.file"].startswith(SECRETS_DIR)
