"""`crescent secrets`: the compose folder is filled once and kept (files 0600 in a 0700
folder, none a placeholder, every derived file agreeing with its secrets), the Kubernetes
Secret is fresh, valid and complete, and `exec` hands a file's secret to a real process."""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import nats
import nats.errors
import pytest

from crescent.secrets_init import (
    API_KEY,
    API_KEYS,
    DB_URL,
    NATS_CONFIG,
    NATS_CONFIG_KEY,
    NATS_SECRET,
    SecretPlan,
    ensure_files,
    nats_password_key,
    role_plan,
    role_secret_name,
    tls_secret_name,
)
from crescent.secrets_tls import SERVER_NAME
from services.gateway.auth import key_digest, parse_key_file
from shared.bus import tls_options
from shared.secrets import MIN_SECRET_CHARS, is_placeholder
from shared.tls import TlsSettings
from tests.deploy.generated import k8s_tls_folder, local_k8s_config
from tests.deploy.test_k8s import VERSION, generated_keys
from tests.support.nats import free_port, nats_server_binary, wait_for_port

ROLES = ("gateway", "scheduler", "prefill", "decode", "tierd", "kvindex", "kvindex-relay")
RANDOM = ("cache-secret", "cachemeta-token", "postgres-password", "s3-secret-key", API_KEY)


def crescent(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crescent", "secrets", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def contents(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_the_compose_folder_is_filled_once_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    first = crescent("compose", str(folder))
    assert first.returncode == 0, first.stderr
    assert "generated" in first.stdout and "api-key" in first.stdout
    made = contents(folder)
    second = crescent("compose", str(folder))
    assert second.returncode == 0, second.stderr
    assert "none changed" in second.stdout
    assert contents(folder) == made
    # Nothing the command printed is a secret.
    printed = first.stdout + first.stderr + second.stdout + second.stderr
    for name in RANDOM:
        value = made[name].strip()
        assert value not in printed
    assert "PRIVATE KEY" not in printed


def test_the_folder_and_every_file_are_private(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    ensure_files(folder, role_plan())
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


def test_no_secret_is_a_placeholder_or_short_and_no_two_are_equal(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    ensure_files(folder, role_plan())
    plan = role_plan()
    values = {name: (folder / name).read_text().strip() for name in plan.makers()}
    assert not any(is_placeholder(v) for v in values.values())
    randoms = [values[n] for n in (*RANDOM, *map(nats_password_key, plan.nats_users))]
    assert all(len(v) >= MIN_SECRET_CHARS for v in randoms)
    assert len(set(randoms)) == len(randoms)


def test_a_removed_secret_alone_is_made_again_and_the_derived_files_follow(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    ensure_files(folder, role_plan())
    before = contents(folder)
    (folder / "postgres-password").unlink()
    assert ensure_files(folder, role_plan()) == ["postgres-password"]
    after = contents(folder)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"postgres-password", DB_URL}
    assert f":{after['postgres-password'].strip()}@" in after[DB_URL]


def test_a_placeholder_left_in_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    ensure_files(folder, role_plan())
    (folder / "cache-secret").write_text("change-me-in-production\n")
    done = crescent("compose", str(folder))
    assert done.returncode == 1
    assert "cache-secret holds a known placeholder" in done.stdout


def test_the_api_key_file_admits_the_operators_key_only(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    ensure_files(folder, role_plan())
    listed = parse_key_file((folder / API_KEYS).read_text())
    key = (folder / API_KEY).read_text().strip()
    assert listed == {key_digest(key): "default"}
    assert key not in (folder / API_KEYS).read_text()


def test_the_nats_users_are_a_parameter(tmp_path: Path) -> None:
    folder = tmp_path / "secrets"
    users = ("gateway", "scheduler", "prefill", "decode", "tierd")
    ensure_files(folder, SecretPlan(users[:2]))
    config = (folder / NATS_CONFIG).read_text()
    assert '"gateway"' in config and '"scheduler"' in config and '"prefill"' not in config
    assert not (folder / nats_password_key("prefill")).exists()


def k8s_objects(*flags: str) -> tuple[dict[str, dict[str, str]], str]:
    """What ``crescent secrets k8s FLAGS`` prints: each Secret's data by name (every one
    checked against the schema), and its notice."""
    done = crescent("k8s", *flags)
    assert done.returncode == 0, done.stderr
    listing = json.loads(done.stdout)
    assert (listing["apiVersion"], listing["kind"]) == ("v1", "List")
    secrets = {}
    for item in listing["items"]:
        kubernetes_validate.validate(item, VERSION, strict=True)
        assert (item["kind"], item["metadata"]["namespace"]) == ("Secret", "crescent")
        secrets[item["metadata"]["name"]] = item["stringData"]
    return secrets, done.stderr


def test_the_k8s_secrets_are_valid_fresh_and_show_the_key_once() -> None:
    (first, notice), (second, _) = k8s_objects(), k8s_objects()
    data = first["crescent-secrets"]
    assert set(data) == generated_keys()
    assert API_KEY not in data and NATS_CONFIG not in data
    # NATS's credentials are not in the Secret every pod reads from.
    assert not any(key.startswith("nats-") for key in data)
    # The key is on stderr (the terminal), its digest alone in the Secret.
    key = notice.strip().splitlines()[-1]
    assert parse_key_file(data[API_KEYS]) == {key_digest(key): "default"}
    assert not any(key in value for secret in first.values() for value in secret.values())
    assert not any(is_placeholder(v) for secret in first.values() for v in secret.values())
    assert second["crescent-secrets"]["cache-secret"] != data["cache-secret"]
    assert second["crescent-nats-decode"] != first["crescent-nats-decode"]


def test_each_role_gets_a_secret_of_its_pods_passwords_and_nats_admits_exactly_them() -> None:
    secrets, _ = k8s_objects("--prefill-slots", "6", "--decode-slots", "3")
    expected = {
        "gateway": [f"crescent-gateway-{i}" for i in range(2)],
        "scheduler": [f"crescent-scheduler-{i}" for i in range(2)],
        "prefill": [f"crescent-prefill-{i}" for i in range(6)],
        "decode": [f"crescent-decode-{i}" for i in range(3)],
        # A DaemonSet's pods have no ordinal: tierd keeps its role's user.
        "tierd": ["tierd"],
        # One Deployment pod: kvindex has a user of its own.
        "kvindex": ["kvindex"],
        # Every relay of another engine's KV events shares one.
        "kvindex-relay": ["kvindex-relay"],
    }
    tls = {tls_secret_name(n) for n in ("nats", "cachemeta", "s3", *expected)}
    assert set(secrets) == {"crescent-secrets", NATS_SECRET, *map(role_secret_name, expected), *tls}
    config = secrets[NATS_SECRET][NATS_CONFIG_KEY]
    users = [u for role in expected for u in secrets[role_secret_name(role)]]
    assert sorted(users) == sorted(u for ids in expected.values() for u in ids)
    assert config.count("user: ") == len(users)
    for role, ids in expected.items():
        for user in ids:
            password = secrets[role_secret_name(role)][user]
            assert f'user: "{user}"\n' in config and f'password: "{password}"' in config
    assert len({p for role in expected for p in secrets[role_secret_name(role)].values()}) == len(
        users
    )


def test_nats_only_rotates_the_nats_secrets_alone() -> None:
    secrets, notice = k8s_objects("--nats-only", "--decode-slots", "1")
    assert set(secrets) == {NATS_SECRET, *(role_secret_name(r) for r in ROLES)}
    assert set(secrets[role_secret_name("decode")]) == {"crescent-decode-0"}
    assert "API key" not in notice and "restart NATS" in notice


def test_a_slot_count_below_one_is_refused() -> None:
    done = crescent("k8s", "--prefill-slots", "0")
    assert done.returncode == 2 and "--prefill-slots" in done.stderr


def test_the_k8s_configuration_runs_on_a_real_server_for_a_pods_user(tmp_path: Path) -> None:
    secrets, _ = k8s_objects("--decode-slots", "2")
    server_tls = k8s_tls_folder(tmp_path / "nats-tls", secrets[tls_secret_name("nats")])
    config = local_k8s_config(secrets[NATS_SECRET][NATS_CONFIG_KEY], server_tls, tmp_path / "nats")
    pod = "crescent-decode-1"
    password = secrets[role_secret_name("decode")][pod]
    folder = k8s_tls_folder(tmp_path / "decode-tls", secrets[tls_secret_name("decode")])
    tls = TlsSettings(
        tls="on",
        tls_ca_file=folder / "ca.crt",
        tls_cert_file=folder / "tls.crt",
        tls_key_file=folder / "tls.key",
        tls_server_name=SERVER_NAME,
    )
    port = free_port()
    argv = [str(nats_server_binary()), "-c", str(config), "-p", str(port)]
    argv += ["-a", "127.0.0.1", "-m", str(free_port())]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 10, server)
        asyncio.run(_connect(port, pod, password, tls))
    finally:
        server.terminate()
        server.wait(10)


async def _connect(port: int, user: str, password: str, tls: TlsSettings) -> None:
    url = f"nats://127.0.0.1:{port}"
    options = tls_options(url, tls)
    nc = await nats.connect(url, user=user, password=password, allow_reconnect=False, **options)
    await nc.close()
    # Another pod's name with this pod's password is not a way in.
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            url, user="crescent-decode-0", password=password, allow_reconnect=False, **options
        )


def test_exec_hands_a_files_secret_to_the_command(tmp_path: Path) -> None:
    secret = tmp_path / "cache-secret"
    secret.write_text("a-chosen-value-0123456789\n")
    show = "import os; print(os.environ['CRESCENT_CACHE_SECRET'])"
    done = crescent(
        "exec", "--env", f"CRESCENT_CACHE_SECRET={secret}", "--", sys.executable, "-c", show
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "a-chosen-value-0123456789"


@pytest.mark.parametrize(
    "assignment", ["CRESCENT_CACHE_SECRET", "CRESCENT_CACHE_SECRET=/nonexistent"]
)
def test_exec_refuses_a_missing_file_without_running_the_command(assignment: str) -> None:
    done = crescent("exec", "--env", assignment, "--", sys.executable, "-c", "print('ran')")
    assert done.returncode == 1
    assert "ran" not in done.stdout and "CRESCENT_CACHE_SECRET" in done.stderr
