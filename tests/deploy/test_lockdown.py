"""No secret ships, and the containers are locked down: docker-compose.yml, the Dockerfile and
everything under deploy/ hold no secret value nor any placeholder that once stood for one;
compose passes credentials to services only as files of the generated secrets volume; Crescent's
containers and NATS run as the image's non-root user, read-only, without capabilities; every
published port is on loopback only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared.secrets import KNOWN_PLACEHOLDERS
from tests.deploy.generated import SECRETS_DIR, generate
from tests.deploy.test_compose import ROOT, rendered
from tests.deploy.test_images import instructions

CREDENTIAL = re.compile(r"(PASSWORD|TOKEN|SECRET|SECRET_KEY|ACCESS_KEY|DB_URL|API_KEYS?)$")
UID = "10001"
CRESCENT = (
    "secrets-init", "gateway", "cachemeta", "scheduler", "prefill", "decode", "tierd", "kvindex"
)  # fmt: skip
LOCKED = (*CRESCENT, "nats")
#: Markers of stand-in values, as every earlier version of these files wrote them.
MARKERS = ("change-me", "changeme", "replace-me", "trial-")


def shipped_files() -> list[Path]:
    deploy = [
        p for p in (ROOT / "deploy").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    ]
    return [ROOT / "docker-compose.yml", ROOT / "Dockerfile", *deploy]


@pytest.mark.parametrize("path", shipped_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_placeholder_secret_ships(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="replace").lower()
    for marker in MARKERS:
        assert marker not in text, marker
    for known in KNOWN_PLACEHOLDERS:
        if len(known) >= 12:
            assert known.lower() not in text, known


def test_compose_passes_credentials_only_as_generated_files(tmp_path: Path) -> None:
    config = rendered()
    folder = generate(tmp_path / "secrets")
    assert not config.get("configs"), "a config with inline content would ship in the file"
    for name, service in config["services"].items():
        for var, value in service.get("environment", {}).items():
            assert not CREDENTIAL.search(var), f"{name}: {var} is set in the file"
            if var.endswith(("_FILE", "_BUNDLE")) and str(value).startswith(SECRETS_DIR):
                assert (folder / Path(value).relative_to(SECRETS_DIR)).is_file(), (name, var)
        for word in service.get("command") or []:
            for path in re.findall(rf"{SECRETS_DIR}/[\w./-]+", str(word)):
                assert (folder / Path(path).relative_to(SECRETS_DIR)).is_file(), (name, path)


def test_every_service_reading_secrets_mounts_the_volume_read_only() -> None:
    services = rendered()["services"]
    for name, service in services.items():
        mounts = [v for v in service.get("volumes", []) if v["source"] == "secrets"]
        if name == "secrets-init":
            assert mounts and not mounts[0].get("read_only", False)
        elif SECRETS_DIR in str(service.get("environment")) + str(service.get("command")):
            assert mounts and mounts[0]["read_only"] is True, name
            assert mounts[0]["target"] == SECRETS_DIR, name
        else:
            assert not mounts, f"{name} reads no secret, so it mounts none"


@pytest.mark.parametrize("name", LOCKED)
def test_the_containers_run_unprivileged(name: str) -> None:
    service = rendered()["services"][name]
    assert service["user"] == f"{UID}:{UID}"
    assert service["read_only"] is True
    assert service["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in service["security_opt"]


def test_every_published_port_is_on_loopback_only() -> None:
    services = rendered()["services"]
    published = [(n, p) for n, s in services.items() for p in s.get("ports", [])]
    assert published
    for name, port in published:
        assert port["host_ip"] == "127.0.0.1", name


def test_the_image_runs_as_its_own_non_root_user() -> None:
    lines = instructions()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] == f"{UID}:{UID}"
    (create,) = [line for line in lines if "useradd" in line]
    assert f"--uid {UID}" in create and f"--gid {UID}" in create
    # What the volumes start from is the user's own; the secrets folder is private.
    assert "chown -R crescent:crescent /var/cache/crescent /var/lib/crescent" in create
    assert "chmod 0700 /var/lib/crescent/secrets" in create
    assert lines.index(next(x for x in lines if x.startswith("USER "))) > lines.index(
        next(x for x in lines if x.startswith("RUN pip install"))
    )
