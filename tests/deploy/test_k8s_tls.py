"""deploy/k8s runs every internal link over mutual TLS: each pod mounts its own TLS Secret (from
`crescent secrets k8s`) read-only and no other, its environment points CRESCENT_TLS_* there,
and a handshake of every client with every server it dials, under the name it checks, succeeds
with the generated certificates: NATS (whose configuration names the files it mounts),
cachemeta, KV pulls between pods, and tierd's https S3."""

from __future__ import annotations

import functools
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from crescent.secrets_init import NATS_CONFIG_KEY, NATS_SECRET, tls_secret_name
from crescent.secrets_tls import K8S_TLS_DIR
from shared.tls import TlsSettings, target_host, url_host
from tests.deploy.generated import k8s_tls_folder
from tests.deploy.handshake import PEER_ADDRESS, dial, handshake, nats_server_tls
from tests.deploy.test_k8s import by_kind, container, generated_secrets, pod_env
from tests.deploy.test_k8s import workloads as read_workloads

ROLES = {
    "gateway": "crescent-gateway",
    "scheduler": "crescent-scheduler",
    "cachemeta": "crescent-cachemeta",
    "prefill": "crescent-prefill",
    "decode": "crescent-decode",
    "tierd": "crescent-tierd",
    "kvindex": "crescent-kvindex",
    "nats": "nats",
    "s3": "s3",
}
NATS_CLIENTS = ("gateway", "scheduler", "prefill", "decode", "tierd", "kvindex")
CACHEMETA_CLIENTS = ("scheduler", "prefill", "decode", "tierd")
PULL_SERVERS = ("prefill", "decode", "tierd")


# The manifests do not change during a run; parsing them once keeps the many cases quick.
workloads = functools.cache(read_workloads)
shared_env = functools.cache(lambda: dict(by_kind("ConfigMap")["crescent-env"]["data"]))


@pytest.fixture(scope="module")
def secrets() -> dict[str, dict[str, str]]:
    return generated_secrets()


def tls_mount(role: str, secrets: dict[str, dict[str, str]], root: Path) -> Path:
    """Where ``role``'s pod finds its TLS files, here: the Secret it mounts at K8S_TLS_DIR,
    written into ``root``. It mounts exactly one TLS Secret, its own, read-only."""
    workload = workloads()[ROLES[role]]
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    tls_secrets = [
        v["secret"]["secretName"]
        for v in volumes.values()
        if v.get("secret", {}).get("secretName", "").startswith("crescent-tls-")
    ]
    assert tls_secrets == [tls_secret_name(role)], role
    (mount,) = [m for m in container(workload)["volumeMounts"] if m["mountPath"] == K8S_TLS_DIR]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"]["secretName"] == tls_secret_name(role)
    return k8s_tls_folder(root / role, secrets[tls_secret_name(role)])


def pod_settings(
    role: str, secrets: dict[str, dict[str, str]], root: Path
) -> tuple[TlsSettings, dict[str, str]]:
    """``role``'s TLS settings from the ConfigMap and its container's environment, with the
    mounted Secret's files in ``root``."""
    folder = tls_mount(role, secrets, root)
    env: dict[str, str] = dict(shared_env())
    env |= pod_env(workloads()[ROLES[role]], f"{ROLES[role]}-0")
    env = {k: v.replace(K8S_TLS_DIR, str(folder)) for k, v in env.items()}
    settings = TlsSettings.model_validate(
        {
            "tls": env["CRESCENT_TLS"],
            "tls_ca_file": env["CRESCENT_TLS_CA_FILE"],
            "tls_cert_file": env["CRESCENT_TLS_CERT_FILE"],
            "tls_key_file": env["CRESCENT_TLS_KEY_FILE"],
            "tls_server_name": env.get("CRESCENT_TLS_SERVER_NAME"),
        }
    )
    return settings, env


def nats_server(secrets: dict[str, dict[str, str]], root: Path) -> TlsSettings:
    folder = tls_mount("nats", secrets, root)
    config = secrets[NATS_SECRET][NATS_CONFIG_KEY]
    return nats_server_tls(config, lambda text: text.replace(K8S_TLS_DIR, str(folder)))


@pytest.mark.parametrize("role", NATS_CLIENTS)
def test_every_pod_reaches_nats_over_mutual_tls(
    role: str, secrets: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    client, env = pod_settings(role, secrets, tmp_path)
    assert client.tls == "on"
    server = nats_server(secrets, tmp_path)
    host = url_host(env["CRESCENT_NATS_URL"])
    dial(client, server, "the NATS connection", host)
    if client.tls_server_name is None:
        # The namespace-qualified forms of the Service name verify too.
        for name in (f"{host}.crescent", f"{host}.crescent.svc.cluster.local"):
            dial(client, server, "the NATS connection", name)


@pytest.mark.parametrize("role", CACHEMETA_CLIENTS)
def test_cachemetas_callers_reach_it_over_mutual_tls(
    role: str, secrets: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    client, env = pod_settings(role, secrets, tmp_path)
    server, _ = pod_settings("cachemeta", secrets, tmp_path)
    dial(client, server, "cachemeta", target_host(env["CRESCENT_CACHEMETA_URL"]))


@pytest.mark.parametrize("puller", PULL_SERVERS)
@pytest.mark.parametrize("source", PULL_SERVERS)
def test_kv_pulls_between_pods_run_over_mutual_tls(
    puller: str, source: str, secrets: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    client, env = pod_settings(puller, secrets, tmp_path / "client")
    server, server_env = pod_settings(source, secrets, tmp_path / "server")
    assert env["CRESCENT_TRANSFER"] == "tcp"
    server.server_context("KV transfer", server_env["CRESCENT_TRANSFER_HOST"])
    dial(client, server, "KV transfer", PEER_ADDRESS)


def test_a_gateway_or_scheduler_certificate_cannot_serve_pulls(
    secrets: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    client, _ = pod_settings("decode", secrets, tmp_path)
    near = client.client_context("pull", PEER_ADDRESS)
    for role in ("gateway", "scheduler"):
        impostor, _ = pod_settings(role, secrets, tmp_path)
        far = impostor.server_context("pull", "")
        assert near is not None and far is not None
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(near, far, client.tls_server_name or PEER_ADDRESS)


def test_tierd_reaches_the_in_cluster_s3_over_verified_https(
    secrets: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    _, env = pod_settings("tierd", secrets, tmp_path)
    endpoint = urlsplit(env["CRESCENT_S3_ENDPOINT"])
    assert endpoint.scheme == "https" and env["CRESCENT_S3_ALLOW_HTTP"] == "false"
    folder = tls_mount("s3", secrets, tmp_path)
    command = container(workloads()["s3"])["command"]
    flags = dict(word.split("=", 1) for word in command if "=" in word)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(
        *(flags[f"-s3.{k}.file"].replace(K8S_TLS_DIR, str(folder)) for k in ("cert", "key"))
    )
    client = ssl.create_default_context(cafile=env["CRESCENT_S3_CA_BUNDLE"])
    handshake(client, server, endpoint.hostname or "")


def test_the_tls_secrets_hold_one_certificate_its_key_and_the_ca(
    secrets: dict[str, dict[str, str]],
) -> None:
    cas = set()
    for role in ROLES:
        data = secrets[tls_secret_name(role)]
        assert set(data) == {"ca.crt", "tls.crt", "tls.key"}
        assert "PRIVATE KEY" not in data["ca.crt"] + data["tls.crt"]
        cas.add(data["ca.crt"])
    assert len(cas) == 1
