"""The certificates secrets-init and `crescent secrets k8s` make: signed by the deployment's CA,
for exactly the names each service is dialled by, valid as server and client, private files;
kept across runs unless missing, expiring soon, for other names or from another CA; and a real
NATS server run with the generated compose configuration admits a client that presents a
generated certificate over TLS and nothing in clear or from another CA."""

from __future__ import annotations

import asyncio
import datetime
import json
import stat
import subprocess
import sys
from pathlib import Path

import nats
import nats.errors
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from crescent.certs import write_cert
from crescent.secrets_init import compose_plan, ensure_files, nats_password_key, tls_secret_name
from crescent.secrets_tls import SERVER_NAME
from crescent.slots import SlotSettings
from shared.bus import tls_options
from shared.tls import TlsSettings
from tests.deploy.generated import compose_tls, local_nats_config
from tests.support.nats import free_port, nats_server_binary, wait_for_port

#: The names each compose certificate must carry, and nothing else.
COMPOSE_NAMES = {
    "nats": {"nats", SERVER_NAME},
    "cachemeta": {"cachemeta", SERVER_NAME},
    "s3": {"s3"},
    "gateway": {"gateway"},
    "scheduler": {"scheduler"},
    "prefill": {SERVER_NAME},
    "decode": {SERVER_NAME},
    "tierd": {SERVER_NAME},
    # Clients of NATS only: they serve no TLS, so they carry no shared name.
    "kvindex": {"kvindex"},
    "kvindex-relay": {"kvindex-relay"},
}


def fill(folder: Path) -> list[str]:
    return ensure_files(folder / "secrets", compose_plan(SlotSettings(), "compose"), folder / "ca")


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_every_certificate_is_the_cas_for_its_names_as_server_and_client(tmp_path: Path) -> None:
    fill(tmp_path)
    tls = tmp_path / "secrets" / "tls"
    ca = load(tls / "ca.pem")
    assert ca == load(tmp_path / "ca" / "ca.pem")
    assert {s.name for s in compose_plan(SlotSettings(), "compose").certs} == set(COMPOSE_NAMES)
    for name, names in COMPOSE_NAMES.items():
        cert = load(tls / f"{name}.pem")
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(sans.get_values_for_type(x509.DNSName)) == names, name
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > datetime.timedelta(
            days=300
        )


def test_the_files_are_private_and_the_cas_key_stays_out_of_the_services_volume(
    tmp_path: Path,
) -> None:
    fill(tmp_path)
    for folder in (tmp_path / "secrets" / "tls", tmp_path / "ca"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for path in folder.iterdir():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert (tmp_path / "ca" / "ca.key").is_file()
    assert not list((tmp_path / "secrets").rglob("ca.key"))


def test_a_second_run_keeps_every_certificate(tmp_path: Path) -> None:
    first = fill(tmp_path)
    assert "tls/ca.pem" in first and "tls/nats.pem" in first
    tls = tmp_path / "secrets" / "tls"
    before = {p.name: p.read_bytes() for p in tls.iterdir()}
    assert fill(tmp_path) == []
    assert {p.name: p.read_bytes() for p in tls.iterdir()} == before


def test_a_certificate_expiring_soon_or_for_other_names_is_made_again_alone(
    tmp_path: Path,
) -> None:
    fill(tmp_path)
    tls = tmp_path / "secrets" / "tls"
    # Same CA, but ten days left; and one for names the stack no longer uses.
    short = write_cert(tmp_path / "ca", "prefill", ["crescent-internal"], [], days=10)
    other = write_cert(tmp_path / "ca", "decode", ["elsewhere"], [])
    for name, files in (("prefill", short), ("decode", other)):
        (tls / f"{name}.pem").write_bytes(files.cert.read_bytes())
        (tls / f"{name}.key").write_bytes(files.key.read_bytes())
    kept = (tls / "nats.pem").read_bytes()
    assert sorted(fill(tmp_path)) == ["tls/decode.pem", "tls/prefill.pem"]
    assert (tls / "nats.pem").read_bytes() == kept
    for name in ("prefill", "decode"):
        cert = load(tls / f"{name}.pem")
        assert cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > datetime.timedelta(
            days=300
        )


def test_a_new_ca_reissues_every_certificate(tmp_path: Path) -> None:
    fill(tmp_path)
    (tmp_path / "ca" / "ca.key").unlink()
    made = fill(tmp_path)
    assert set(made) == {"tls/ca.pem", *(f"tls/{n}.pem" for n in COMPOSE_NAMES)}
    ca = load(tmp_path / "secrets" / "tls" / "ca.pem")
    for name in COMPOSE_NAMES:
        load(tmp_path / "secrets" / "tls" / f"{name}.pem").verify_directly_issued_by(ca)


def test_a_real_nats_server_admits_a_generated_client_over_tls_only(tmp_path: Path) -> None:
    fill(tmp_path)
    folder = tmp_path / "secrets"
    port = free_port()
    argv = [str(nats_server_binary()), "-c", str(local_nats_config(folder)), "-p", str(port)]
    argv += ["-a", "127.0.0.1", "-m", str(free_port())]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    foreign = write_cert(tmp_path / "other-ca", "gateway", ["gateway"], [])
    try:
        wait_for_port(port, 10, server)
        asyncio.run(_tls_only(folder, port, foreign.cert, foreign.key))
    finally:
        server.terminate()
        server.wait(10)


async def _tls_only(folder: Path, port: int, foreign_cert: Path, foreign_key: Path) -> None:
    url = f"nats://127.0.0.1:{port}"
    password = (folder / nats_password_key("gateway-0")).read_text().strip()
    auth = {"user": "gateway-0", "password": password, "allow_reconnect": False}
    good = compose_tls(folder, "gateway")
    nc = await nats.connect(url, **auth, **tls_options(url, good))
    assert nc.is_connected
    await nc.close()
    # In clear: the server waits for a TLS handshake and never greets this client.
    with pytest.raises((nats.errors.Error, OSError, asyncio.TimeoutError)):
        await nats.connect(url, **auth, connect_timeout=3)
    # A certificate from another CA, whatever names it carries, is refused.
    stranger = TlsSettings(
        tls="on",
        tls_ca_file=good.tls_ca_file,
        tls_cert_file=foreign_cert,
        tls_key_file=foreign_key,
        tls_server_name="nats",
    )
    with pytest.raises((nats.errors.Error, OSError, asyncio.TimeoutError)):
        await nats.connect(url, **auth, connect_timeout=3, **tls_options(url, stranger))


def crescent(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "crescent", "secrets", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_k8s_keeps_its_ca_in_the_folder_given_and_renews_certificates_alone(
    tmp_path: Path,
) -> None:
    ca_dir = tmp_path / "ca"
    first = crescent("k8s", "--ca-dir", str(ca_dir))
    renewed = crescent("k8s", "--tls-only", "--ca-dir", str(ca_dir))
    assert first.returncode == 0 and renewed.returncode == 0, first.stderr + renewed.stderr
    for done in (first, renewed):
        assert "PRIVATE KEY" not in done.stderr
    tls = {i["metadata"]["name"]: i for i in json.loads(renewed.stdout)["items"]}
    every = {i["metadata"]["name"]: i for i in json.loads(first.stdout)["items"]}
    assert set(tls) == {n for n in every if n.startswith("crescent-tls-")}
    ca = load(ca_dir / "ca.pem")
    nats_secret = tls[tls_secret_name("nats")]
    assert nats_secret["type"] == "kubernetes.io/tls"
    for secret in (nats_secret, every[tls_secret_name("nats")]):
        data = secret["stringData"]
        cert = x509.load_pem_x509_certificate(data["tls.crt"].encode())
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert set(sans.get_values_for_type(x509.DNSName)) == {
            "nats",
            "nats.crescent",
            "nats.crescent.svc",
            "nats.crescent.svc.cluster.local",
            SERVER_NAME,
        }
