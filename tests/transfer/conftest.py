"""Block servers in child processes and one event loop per module for the transfer tests."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# UCX listens on every interface unless told otherwise; ucxx reads these when its context is
# created, which happens in each process on first use, so the children inherit them.
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("tcp", "ucx")


def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    """The next line a child prints, or "" if none comes within ``timeout_s``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().strip() if ready else ""


class PeerProcess:
    """A ``tests.transfer.peer`` server in a child process.

    Owns the child. Invariant: ``address`` is the child's published address once constructed.
    """

    def __init__(self, kind: str, *args: str) -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.transfer.peer", kind, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = read_line(self.proc, 30.0).split()
        if len(line) != 2 or line[0] != "ADDRESS":
            self.kill()
            raise RuntimeError(f"{kind} peer did not start (got {line!r})")
        self.address = bytes.fromhex(line[1])

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        """Close its standard input, which asks it to close its server and exit."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def run() -> Iterator[asyncio.Runner]:
    """One loop for the whole module: ucxx ties its progress task to the loop that runs it."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="module", params=KINDS)
def peer(request: pytest.FixtureRequest, run: asyncio.Runner) -> Iterator[PeerProcess]:
    server = PeerProcess(request.param)
    yield server
    # UCX closes a process's endpoints as it exits, and each close waits for the peer to
    # progress: keep this process's loop turning until the server is gone.
    run.run(asyncio.to_thread(server.stop))
