"""The secrets of docker-compose.yml as its secrets-init service writes them, in a test's own
folder, and the services' environment pointed there instead of at the volume (a replica that
claims a slot gets its role's first one, as the first replica would)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from crescent.secret_files import private_dir, write_private
from crescent.secrets_init import TLS_DIR, compose_plan, ensure_files, nats_password_key
from crescent.secrets_tls import K8S_TLS_DIR
from crescent.slots import SlotSettings, read_slots
from shared.tls import TlsSettings

#: Where docker-compose.yml mounts the secrets volume in every container.
SECRETS_DIR = "/var/lib/crescent/secrets"


def generate(directory: Path) -> Path:
    """The folder secrets-init would fill, filled."""
    ensure_files(directory, compose_plan(SlotSettings(), "compose"))
    return directory


def localized(value: str, directory: Path) -> str:
    """``value`` with the volume's path replaced by ``directory``."""
    return value.replace(SECRETS_DIR, str(directory))


def service_env(service: dict[str, Any], directory: Path) -> dict[str, str]:
    """A compose service's environment, plus what its ``crescent secrets exec`` wrapper sets,
    with every secret file read from ``directory``."""
    env = {k: localized(str(v), directory) for k, v in service.get("environment", {}).items()}
    command = [str(word) for word in service.get("command") or []]
    if command[:3] == ["crescent", "secrets", "exec"]:
        for flag, value in itertools.pairwise(command):
            if flag == "--env":
                name, _, path = value.partition("=")
                env[name] = Path(localized(path, directory)).read_text().strip()
            if flag == "--claim":
                node_id = read_slots(directory, value)[0]
                env["CRESCENT_NODE_ID"] = env["CRESCENT_NATS_USER"] = node_id
                env["CRESCENT_NATS_PASSWORD_FILE"] = str(directory / nats_password_key(node_id))
    return env


def local_nats_config(folder: Path) -> Path:
    """secrets-init's NATS configuration with its TLS files read from ``folder``, as a test's
    server runs it."""
    text = localized((folder / "nats-config").read_text(), folder)
    path = folder / "nats-local.conf"
    path.write_text(text)
    path.chmod(0o600)
    return path


def compose_tls(folder: Path, name: str, server_name: str | None = "nats") -> TlsSettings:
    """The TLS settings of the compose service whose certificate is ``name``, its files in
    ``folder``; ``server_name``: the name a test dialling 127.0.0.1 checks instead."""
    tls = folder / TLS_DIR
    return TlsSettings(
        tls="on",
        tls_ca_file=tls / "ca.pem",
        tls_cert_file=tls / f"{name}.pem",
        tls_key_file=tls / f"{name}.key",
        tls_server_name=server_name,
    )


def tls_env(settings: TlsSettings) -> dict[str, str]:
    """``settings`` as the variables a child process reads them from."""
    ca, cert, key = settings.files()
    env = {
        "CRESCENT_TLS": settings.tls,
        "CRESCENT_TLS_CA_FILE": str(ca),
        "CRESCENT_TLS_CERT_FILE": str(cert),
        "CRESCENT_TLS_KEY_FILE": str(key),
    }
    if settings.tls_server_name:
        env["CRESCENT_TLS_SERVER_NAME"] = settings.tls_server_name
    return env


def k8s_tls_folder(directory: Path, data: dict[str, str]) -> Path:
    """A TLS Secret's keys written as its mount would show them, in ``directory``."""
    private_dir(directory)
    for key, value in data.items():
        write_private(directory / key, value)
    return directory


def local_k8s_config(config: str, tls_folder: Path, directory: Path) -> Path:
    """The generated ``nats.conf`` with its TLS files read from ``tls_folder``."""
    path = private_dir(directory) / "crescent.conf"
    write_private(path, config.replace(K8S_TLS_DIR, str(tls_folder)))
    return path


def service_tls(env: dict[str, str], dialled: str = "nats") -> TlsSettings:
    """The TLS settings a service's environment ``env`` gives it, for a test that dials
    127.0.0.1 where the service would dial the host ``dialled``: the name it checks is its
    CRESCENT_TLS_SERVER_NAME if it sets one, else ``dialled``."""
    return TlsSettings.model_validate(
        {
            "tls": env["CRESCENT_TLS"],
            "tls_ca_file": env["CRESCENT_TLS_CA_FILE"],
            "tls_cert_file": env["CRESCENT_TLS_CERT_FILE"],
            "tls_key_file": env["CRESCENT_TLS_KEY_FILE"],
            "tls_server_name": env.get("CRESCENT_TLS_SERVER_NAME") or dialled,
        }
    )
