"""`crescent serve ROLE`: one service started as `crescent up` would start it, from a copy of
the deployment's secrets folder and the addresses of the servers it meets; what it lacks is
refused before it starts, in one line that names the setting."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from crescent import cli, serve
from crescent.serve_secrets import SecretsFolder, write
from crescent.slots import SlotSettings
from crescent.up_roles import role_environment
from tests.support.nats import free_port, nats_server_binary, wait_for_port
from tests.support.wait import wait_until


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("serve") / "secrets"
    slots = SlotSettings(gateway_slots=1, scheduler_slots=1, prefill_slots=1, decode_slots=2)
    assert write(directory, slots, None, lambda line: None) == 0
    return directory


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without any Crescent setting, in production mode."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CRESCENT_")}
    return env | {"CRESCENT_DEV_MODE": "false"} | extra


def crescent_serve(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "crescent", "serve", *args]
    env = clean_environment(**extra)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def listener() -> Iterator[int]:
    """A port that accepts connections: a server as the reachability check sees one."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield int(server.getsockname()[1])


def test_a_role_without_its_nats_url_is_refused_naming_the_setting() -> None:
    done = crescent_serve("decode")
    assert done.returncode == 2
    assert "CRESCENT_NATS_URL is not set (--nats-url)" in one_line(done)


def test_a_missing_password_file_is_refused_naming_the_setting(
    folder: Path, tmp_path: Path, listener: int
) -> None:
    copy = tmp_path / "secrets"
    shutil.copytree(folder, copy)
    (copy / "nats-prefill-0-password").unlink()
    where = f"127.0.0.1:{listener}"
    done = crescent_serve(
        "prefill", "--secrets", str(copy), "--nats-url", f"nats://{where}", "--cachemeta-url", where
    )
    assert done.returncode == 2
    assert "CRESCENT_NATS_PASSWORD_FILE" in one_line(done)


def test_a_node_id_must_be_one_of_the_folders_slots(folder: Path) -> None:
    unnamed = crescent_serve("decode", "--secrets", str(folder), "--nats-url", "nats://x:1")
    assert unnamed.returncode == 2 and "decode-0, decode-1" in one_line(unnamed)
    stranger = crescent_serve("decode", "--secrets", str(folder), "--node-id", "decode-7")
    assert stranger.returncode == 2 and "decode-7 is not a decode slot" in one_line(stranger)


def test_a_server_that_does_not_answer_is_named(folder: Path, listener: int) -> None:
    closed = free_port()
    done = crescent_serve(
        "scheduler", "--secrets", str(folder), "--nats-url", f"nats://127.0.0.1:{listener}",
        "--cachemeta-url", f"127.0.0.1:{closed}",
    )  # fmt: skip
    assert done.returncode == 1
    line = one_line(done)
    assert f"cannot reach cachemeta at 127.0.0.1:{closed} (CRESCENT_CACHEMETA_URL)" in line


def prepared(monkeypatch: pytest.MonkeyPatch, *argv: str) -> dict[str, str]:
    for name in list(os.environ):
        if name.upper().startswith("CRESCENT_"):
            monkeypatch.delenv(name)
    args = cli.build_parser().parse_args(["serve", *argv])
    command, env = serve.prepare(args)
    assert command == [sys.executable, "-m", f"services.{args.role}"]
    return env


def test_a_node_runs_as_its_slot_with_the_folders_files(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = prepared(
        monkeypatch, "decode", "--secrets", str(folder), "--node-id", "decode-1",
        "--host-id", "c", "--address", "10.0.0.3", "--data-dir", str(tmp_path),
    )  # fmt: skip
    secrets = SecretsFolder(folder)
    assert env["CRESCENT_NODE_ID"] == env["CRESCENT_NATS_USER"] == "decode-1"
    assert env["CRESCENT_NATS_PASSWORD_FILE"] == str(secrets.file("nats-decode-1-password"))
    assert env["CRESCENT_CACHEMETA_TOKEN_FILE"] == str(secrets.file("cachemeta-token"))
    assert env["CRESCENT_CACHE_SECRET"] == secrets.cache_secret()
    assert env["CRESCENT_TLS_CERT_FILE"] == str(secrets.file("tls") / "decode.pem")
    assert env["CRESCENT_TRANSFER_HOST"] == "10.0.0.3"
    assert (env["CRESCENT_HOST_ID"], env["CRESCENT_NVME_DIR"]) == ("c", str(tmp_path / "nvme"))


def test_each_role_gets_what_it_reads_and_no_more(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = prepared(monkeypatch, "gateway", "--secrets", str(folder))
    assert gateway["CRESCENT_GATEWAY_ID"] == gateway["CRESCENT_NATS_USER"] == "gateway-0"
    assert gateway["CRESCENT_API_KEYS_FILE"] == str(folder / "api-keys")
    assert "CRESCENT_CACHE_SECRET" not in gateway and "CRESCENT_CACHEMETA_TOKEN_FILE" not in gateway
    flags = ("--secrets", str(folder), "--host-id", "b", "--data-dir", str(tmp_path))
    tierd = prepared(monkeypatch, "tierd", *flags)
    # Every host's tierd connects as the role's user, under its own host's id.
    assert (tierd["CRESCENT_NODE_ID"], tierd["CRESCENT_NATS_USER"]) == ("tierd-b", "tierd")
    assert tierd["CRESCENT_S3_SECRET_KEY_FILE"] == str(folder / "s3-secret-key")
    cachemeta = prepared(monkeypatch, "cachemeta", "--secrets", str(folder), "--db-host", "h:6")
    assert "@h:6/crescent" in cachemeta["CRESCENT_DB_URL"]
    assert "CRESCENT_NATS_USER" not in cachemeta


def test_an_instance_wins_over_its_role_and_its_role_over_the_stack() -> None:
    roles = {"decode": {"A": "role", "B": "role"}, "decode-3": {"B": "node"}}
    env = role_environment({"A": "stack", "C": "stack"}, roles, "decode", "decode-3", {"D": "own"})
    assert env == {
        "A": "role",
        "B": "node",
        "C": "stack",
        "D": "own",
        "CRESCENT_NODE_ID": "decode-3",
    }
    scheduler = role_environment({}, {}, "scheduler", "scheduler-1")
    assert scheduler == {"CRESCENT_SCHEDULER_ID": "scheduler-1"}
    assert role_environment({"A": "stack"}, roles, "gateway") == {"A": "stack"}


def test_a_served_service_connects_as_its_slot_and_stops_on_sigterm(
    folder: Path, tmp_path: Path
) -> None:
    nats_port, ops = free_port(), free_port()
    config = str(folder / "nats-config")
    argv = [str(nats_server_binary()), "-c", config, "-a", "127.0.0.1", "-p", str(nats_port)]
    nats = subprocess.Popen([*argv, "-m", str(free_port())], stdout=subprocess.DEVNULL)
    kvindex = None
    try:
        wait_for_port(nats_port, 10, nats)
        command = [sys.executable, "-m", "crescent", "serve", "kvindex", "--secrets", str(folder)]
        command += ["--nats-url", f"nats://127.0.0.1:{nats_port}"]
        own = {"CRESCENT_METRICS_PORT": str(ops), "CRESCENT_KVINDEX_PORT": str(free_port())}
        log = (tmp_path / "kvindex.log").open("w")
        env = clean_environment(**own)
        kvindex = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: _healthy(ops) or kvindex.poll() is not None, "kvindex's /healthz", 180)
        assert kvindex.poll() is None, (tmp_path / "kvindex.log").read_text()
        kvindex.send_signal(signal.SIGTERM)
        assert kvindex.wait(timeout=120) == 0, (tmp_path / "kvindex.log").read_text()
    finally:
        if kvindex is not None and kvindex.poll() is None:
            kvindex.kill()
        nats.kill()
        nats.wait()


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
