"""Compose replicas claim NATS slots for real: `crescent secrets exec --claim ROLE` processes
started on one generated secrets folder take distinct slots, hold them through the exec into
the command, lose them only when that command dies (even by SIGKILL), and one replica more
than the slots exits naming the setting to raise. A claimed slot's credentials open the
generated configuration on a real nats-server and may publish their own heartbeat only.
A Kubernetes pod runs as the slot its name picks, and a pod past the slots is refused."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from crescent import slot_claim
from crescent.secrets_init import (
    NATS_CONFIG_KEY,
    NATS_SECRET,
    compose_plan,
    ensure_files,
    nats_password_key,
    role_secret_name,
    tls_secret_name,
)
from crescent.secrets_tls import K8S_TLS_DIR, SERVER_NAME
from crescent.slots import SlotSettings
from shared import subjects
from shared.bus import tls_options
from tests.deploy.generated import (
    compose_tls,
    k8s_tls_folder,
    local_k8s_config,
    local_nats_config,
    tls_env,
)
from tests.deploy.test_k8s import IDENTITY_DIR, by_kind, container, generated_secrets, pod_env
from tests.support.nats import free_port, nats_server_binary, wait_for_port

#: What a claimed replica runs instead of a service: it reports the identity it was given, then
#: waits until its stdin closes (or it is killed).
REPORT = (
    "import json, os, sys; "
    "keys = ('CRESCENT_NODE_ID', 'CRESCENT_NATS_USER', 'CRESCENT_NATS_PASSWORD_FILE'); "
    "print(json.dumps({k: os.environ[k] for k in keys}), flush=True); sys.stdin.read()"
)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A compose secrets folder with two decode slots."""
    directory = tmp_path / "secrets"
    ensure_files(directory, compose_plan(SlotSettings(decode_slots=2), "compose"))
    return directory


def replica(folder: Path, role: str, *command: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "crescent", "secrets", "exec", "--claim", role]
    argv += ["--secrets-dir", str(folder), "--lock-dir", str(folder.parent / "locks"), "--"]
    return subprocess.Popen(
        [*argv, *command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def identity(process: subprocess.Popen[str]) -> dict[str, str]:
    """The identity a started replica reports (blocks until it has printed it)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        assert process.stderr is not None
        pytest.fail(f"the replica exited ({process.wait(10)}): {process.stderr.read()}")
    reported: dict[str, str] = json.loads(line)
    return reported


@pytest.fixture
def replicas() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        process.kill()
        process.communicate(timeout=30)


def test_replicas_take_distinct_slots_until_none_is_left(
    folder: Path, replicas: list[subprocess.Popen[str]]
) -> None:
    replicas += [replica(folder, "decode", sys.executable, "-c", REPORT) for _ in range(2)]
    first, second = (identity(p) for p in replicas)
    assert {first["CRESCENT_NODE_ID"], second["CRESCENT_NODE_ID"]} == {"decode-0", "decode-1"}
    for claimed in (first, second):
        node_id = claimed["CRESCENT_NODE_ID"]
        assert claimed["CRESCENT_NATS_USER"] == node_id
        assert claimed["CRESCENT_NATS_PASSWORD_FILE"] == str(folder / nats_password_key(node_id))
    # Both slots are held by the commands the claims exec'd into: a third replica is refused
    # at once, without running its command, and is told what to change.
    third = replica(folder, "decode", sys.executable, "-c", "print('ran')")
    out, err = third.communicate(timeout=60)
    assert third.returncode == 1
    assert "ran" not in out
    assert "all 2 decode slot(s) are held" in err and "CRESCENT_DECODE_SLOTS" in err


def test_a_killed_replicas_slot_is_taken_by_the_next(
    folder: Path, replicas: list[subprocess.Popen[str]]
) -> None:
    replicas += [replica(folder, "decode", sys.executable, "-c", REPORT) for _ in range(2)]
    first, second = (identity(p) for p in replicas)
    victim = replicas[0]
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=30)
    # No clean-up ran: the kernel released the dead process's lock.
    replicas.append(replica(folder, "decode", sys.executable, "-c", REPORT))
    assert identity(replicas[-1])["CRESCENT_NODE_ID"] == first["CRESCENT_NODE_ID"]
    assert replicas[1].poll() is None and second["CRESCENT_NODE_ID"] != first["CRESCENT_NODE_ID"]


@pytest.mark.parametrize(
    ("role", "said"),
    [("kvindex", "a stack runs one kvindex"), ("tierd", "a stack runs one tierd per host")],
)
def test_a_second_replica_of_a_one_slot_role_is_told_how_many_run(
    tmp_path: Path, role: str, said: str
) -> None:
    """A stack runs one kvindex, wherever its hosts are, and one tierd on each host."""
    directory, locks = tmp_path / "secrets", tmp_path / "locks"
    ensure_files(directory, compose_plan(SlotSettings(), "compose"))
    held = slot_claim.claim(role, directory, locks)
    try:
        with pytest.raises(slot_claim.NoSlot) as refused:
            slot_claim.claim(role, directory, locks)
    finally:
        os.close(held.lock_fd)
    assert str(refused.value) == f"all 1 {role} slot(s) are held by running replicas: {said}"


def test_a_role_without_slots_in_the_folder_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "secrets"
    ensure_files(directory, compose_plan(SlotSettings(), "compose"))
    done = replica(directory, "cachemeta", sys.executable, "-c", "print('ran')")
    out, err = done.communicate(timeout=60)
    assert done.returncode == 1 and "ran" not in out
    assert "lists no cachemeta slot" in err


#: A replica that connects as the slot it claimed, through the services' own settings, and
#: publishes a heartbeat as itself, as another decode node and as a prefill node.
PUBLISH = """
import asyncio, os, nats
from shared import subjects
from shared.bus import tls_options
from shared.nats_auth import NatsAuthSettings
from shared.tls import from_env

async def main() -> None:
    me = os.environ["CRESCENT_NODE_ID"]
    other = "decode-1" if me == "decode-0" else "decode-0"
    denied = []
    both = asyncio.Event()
    async def errors(exc: Exception) -> None:
        denied.append(str(exc).lower())
        if len(denied) == 2:
            both.set()
    nc = await nats.connect(
        os.environ["NATS_URL"], error_cb=errors, allow_reconnect=False,
        **NatsAuthSettings().connect_options(), **tls_options(os.environ["NATS_URL"], from_env()),
    )
    for role, node in (("decode", other), ("prefill", me), ("decode", me)):
        await nc.publish(subjects.heartbeats(role, node), node.encode())
    await nc.flush()
    await asyncio.wait_for(both.wait(), 60)
    print(me, flush=True)
    print(" | ".join(sorted(denied)), flush=True)
    await nc.close()

asyncio.run(main())
"""


def test_a_claimed_slot_may_publish_only_its_own_heartbeat(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    argv = [str(nats_server_binary()), "-c", str(local_nats_config(folder)), "-p", str(port)]
    argv += ["-a", "127.0.0.1", "-m", str(free_port())]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    monkeypatch.setenv("NATS_URL", f"nats://127.0.0.1:{port}")
    # The replica presents decode's certificate and checks the name pull servers share.
    for name, value in tls_env(compose_tls(folder, "decode", SERVER_NAME)).items():
        monkeypatch.setenv(name, value)
    try:
        wait_for_port(port, 10, server)
        asyncio.run(_watch_heartbeats(folder, port))
    finally:
        server.terminate()
        server.wait(10)


async def _watch_heartbeats(folder: Path, port: int) -> None:
    # The gateway's slot watches every heartbeat, as the gateway does.
    url = f"nats://127.0.0.1:{port}"
    watcher = await nats.connect(
        url,
        user="gateway-0",
        password=(folder / nats_password_key("gateway-0")).read_text().strip(),
        allow_reconnect=False,
        **tls_options(url, compose_tls(folder, "gateway")),
    )
    try:
        seen = await watcher.subscribe(subjects.HEARTBEATS_ALL)
        await watcher.flush()
        process = replica(folder, "decode", sys.executable, "-c", PUBLISH)
        out, err = await asyncio.to_thread(process.communicate, timeout=120)
        assert process.returncode == 0, err
        me, denied = out.splitlines()
        # The server refused both foreign heartbeats and delivered only the slot's own,
        # which was published last: nothing published before it got through.
        message = await seen.next_msg(timeout=30)
        assert message.subject == subjects.heartbeats("decode", me)
        assert message.data == me.encode()
        other = "decode-1" if me == "decode-0" else "decode-0"
        for foreign in (subjects.heartbeats("decode", other), subjects.heartbeats("prefill", me)):
            assert f'permissions violation for publish to "{foreign}"' in denied
        with pytest.raises(nats.errors.TimeoutError):
            await seen.next_msg(timeout=0.5)
    finally:
        await watcher.close()


#: A Kubernetes pod's service stand-in: connects with the node settings the services read (its
#: id from its NATS user) and publishes its heartbeat.
POD = """
import asyncio, nats
from shared import subjects
from shared.bus import tls_options
from shared.node.settings import NodeSettings
from shared.tls import from_env

async def main() -> None:
    settings = NodeSettings()
    me = settings.resolved_node_id("decode")
    nc = await nats.connect(
        settings.nats_url, allow_reconnect=False, **settings.connect_options(),
        **tls_options(settings.nats_url, from_env()),
    )
    await nc.publish(subjects.heartbeats("decode", me), b"")
    await nc.flush()
    await nc.close()
    print(me, flush=True)

asyncio.run(main())
"""


def pod_volume(tmp_path: Path, data: dict[str, str]) -> Path:
    """A Secret mounted as Kubernetes does: one file per key, beside its bookkeeping entries."""
    folder = tmp_path / "nats-identity"
    (folder / "..data").mkdir(parents=True)
    for key, value in data.items():
        (folder / key).write_text(value)
    return folder


def run_pod(pod: str, volume: Path, tls: Path, nats_url: str) -> subprocess.CompletedProcess[str]:
    """The decode StatefulSet's container, as the pod ``pod``: its command and environment as
    the manifest gives them (its TLS settings from the shared ConfigMap), the Secrets' mount
    points moved to ``volume`` and ``tls``."""
    workload = by_kind("StatefulSet")["crescent-decode"]
    shared = by_kind("ConfigMap")["crescent-env"]["data"]
    env = {k: v for k, v in shared.items() if k.startswith("CRESCENT_TLS")}
    env |= pod_env(workload, pod)
    env = {k: v.replace(IDENTITY_DIR, str(volume)) for k, v in env.items()}
    env = {k: v.replace(K8S_TLS_DIR, str(tls)) for k, v in env.items()}
    command = container(workload)["command"]
    argv = [sys.executable, "-m", *command[: command.index("--") + 1], sys.executable, "-c", POD]
    return subprocess.run(
        argv,
        env=dict(os.environ) | env | {"CRESCENT_NATS_URL": nats_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_statefulset_pod_runs_as_its_slot_and_a_pod_past_the_slots_is_refused(
    tmp_path: Path,
) -> None:
    data = generated_secrets(SlotSettings(decode_slots=2))
    server_tls = k8s_tls_folder(tmp_path / "nats-tls", data[tls_secret_name("nats")])
    config = local_k8s_config(data[NATS_SECRET][NATS_CONFIG_KEY], server_tls, tmp_path / "nats")
    volume = pod_volume(tmp_path, data[role_secret_name("decode")])
    tls = k8s_tls_folder(tmp_path / "decode-tls", data[tls_secret_name("decode")])
    port = free_port()
    argv = [str(nats_server_binary()), "-c", str(config), "-p", str(port)]
    argv += ["-a", "127.0.0.1", "-m", str(free_port())]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 10, server)
        url = f"nats://127.0.0.1:{port}"
        done = run_pod("crescent-decode-1", volume, tls, url)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "crescent-decode-1"
        past = run_pod("crescent-decode-2", volume, tls, url)
    finally:
        server.terminate()
        server.wait(10)
    assert past.returncode == 1 and not past.stdout
    assert "pod crescent-decode-2 has no NATS identity" in past.stderr
    assert "2 slot(s) (crescent-decode-0, crescent-decode-1)" in past.stderr
    assert "--decode-slots N" in past.stderr
