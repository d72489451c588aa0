"""docker-compose.yml's tierd: one for the stack's one host, beside its nodes on one NVMe
volume, with the stack's S3 server and the generated keys that server accepts (checked on a
real one)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from crescent.processes import stop_all
from crescent.s3_probe import bucket_status
from crescent.s3_server import BUCKET, S3Keys, run_weed
from services.tierd.config import TierdSettings
from shared.secrets import MIN_SECRET_CHARS
from tests.deploy.generated import SECRETS_DIR, generate, service_env
from tests.deploy.test_compose import rendered

SHARING = ("tierd", "prefill", "decode")
S3_LOCATION = ("ENDPOINT", "BUCKET", "PREFIX")


def env_of(services: dict[str, Any], name: str) -> dict[str, str]:
    return dict(services[name]["environment"])


def identity(folder: Path) -> dict[str, str]:
    identities = json.loads((folder / "s3-identities").read_text())["identities"]
    assert len(identities) == 1
    return dict(identities[0]["credentials"][0])


def test_tierd_and_the_nodes_share_one_nvme_volume_at_one_path() -> None:
    config = rendered()
    services = config["services"]
    paths = {env_of(services, name)["CRESCENT_NVME_DIR"] for name in SHARING}
    assert len(paths) == 1 and paths != {""}
    for name in SHARING:
        mounts = [v for v in services[name]["volumes"] if v["source"] == "nvme"]
        assert [m["target"] for m in mounts] == list(paths), name
        # tierd writes the files; a node only reads them.
        assert mounts[0].get("read_only", False) is (name != "tierd"), name
    assert "nvme" in config["volumes"]
    assert all("CRESCENT_NVME_DIR" not in env_of(services, n) for n in ("gateway", "scheduler"))


def test_tierd_and_the_nodes_agree_on_their_host() -> None:
    services = rendered()["services"]
    hosts = {env_of(services, name).get("CRESCENT_HOST_ID", "") for name in SHARING}
    assert len(hosts) == 1 and hosts != {""}


def test_tierd_is_one_service_with_its_ops_port_checked() -> None:
    services = rendered()["services"]
    tierd = services["tierd"]
    assert tierd["command"][-3:] == ["python", "-m", "services.tierd"]
    assert "container_name" not in tierd and not tierd.get("ports")
    env = env_of(services, "tierd")
    probe = f"http://127.0.0.1:{env['CRESCENT_METRICS_PORT']}/healthz"
    assert any(probe in part for part in tierd["healthcheck"]["test"])
    assert env["CRESCENT_METRICS_HOST"] == "0.0.0.0"


def test_tierd_uses_the_stacks_s3_server_and_alone_holds_its_keys(tmp_path: Path) -> None:
    services = rendered()["services"]
    env = env_of(services, "tierd")
    endpoint = urlsplit(env["CRESCENT_S3_ENDPOINT"])
    assert (endpoint.hostname, endpoint.port) == ("s3", 8333)
    assert "-s3" in services["s3"]["command"]
    assert f"-s3.config={SECRETS_DIR}/s3-identities" in services["s3"]["command"]
    assert (env["CRESCENT_S3_BUCKET"], env["CRESCENT_S3_PREFIX"]) == (BUCKET, "blocks")
    folder = generate(tmp_path / "secrets")
    local = service_env(services["tierd"], folder)
    keys = identity(folder)
    assert Path(local["CRESCENT_S3_ACCESS_KEY_FILE"]).read_text().strip() == keys["accessKey"]
    assert Path(local["CRESCENT_S3_SECRET_KEY_FILE"]).read_text().strip() == keys["secretKey"]
    assert len(keys["secretKey"]) >= MIN_SECRET_CHARS
    for name in set(services) - {"tierd"}:
        assert not any(k.startswith("CRESCENT_S3_") for k in services[name].get("environment", {}))


def test_the_operators_s3_location_replaces_the_stacks(monkeypatch: pytest.MonkeyPatch) -> None:
    given = {f"CRESCENT_S3_{name}": f"operator-{name.lower()}-value" for name in S3_LOCATION}
    for key, value in given.items():
        monkeypatch.setenv(key, value)
    env = env_of(rendered()["services"], "tierd")
    assert {key: env[key] for key in given} == given


def test_tierds_generated_settings_pass_its_production_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = generate(tmp_path / "secrets")
    env = service_env(rendered()["services"]["tierd"], folder)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CRESCENT_DEV_MODE", "false")
    settings = TierdSettings()
    assert str(settings.nvme_dir) == env["CRESCENT_NVME_DIR"]
    assert settings.resolved_host_id() == env["CRESCENT_HOST_ID"]
    s3 = settings.s3_config()
    assert s3 is not None and s3.secret_key == identity(folder)["secretKey"]
    # https to the stack's S3, verified against the stack's own CA.
    assert s3.endpoint.startswith("https://") and s3.ca_bundle == str(folder / "tls" / "ca.pem")


def test_tierds_keys_open_a_real_server_with_the_stacks_identities(tmp_path: Path) -> None:
    folder = generate(tmp_path / "secrets")
    env = service_env(rendered()["services"]["tierd"], folder)
    access_file = Path(env["CRESCENT_S3_ACCESS_KEY_FILE"])
    secret_file = Path(env["CRESCENT_S3_SECRET_KEY_FILE"])
    keys = S3Keys(access_file, secret_file)
    identities = folder / "s3-identities"
    server = run_weed(tmp_path / "s3", identities, keys, dict(os.environ), tmp_path / "logs")
    try:
        access, secret = access_file.read_text().strip(), secret_file.read_text().strip()
        assert bucket_status(server.endpoint, BUCKET, access, secret) == 200
        assert bucket_status(server.endpoint, BUCKET, access, secret + "x") == 403
    finally:
        stop_all([server.child])
