"""A UCX peer killed in the middle of a pull fails that pull, never the process on the other side.

Both sides run in child processes, so a side that UCX aborts shows up as a failed test (its exit
status) rather than as the end of the test run. Kill -9 gives the dying side no chance to say
goodbye: the survivor learns of it only from UCX.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from shared.transfer.base import TransferError, create_client
from shared.transfer.ucx import load_ucx, worker_address_of
from shared.transfer.ucx_settings import UcxSettings
from tests.transfer.conftest import ROOT, PeerProcess, read_line
from tests.transfer.peer import LEASE, SLOW_S

BLOCK = 1_474_560
BIG = 46  # blocks: a 64 MiB pull
PULL_TIMEOUT_S = 6.0
# UCX notices a dead peer either at once (a read of its memory fails) or on a keepalive round
# (every second by default here): well inside the pull's timeout either way.
NOTICED_WITHIN_S = 4.0

# Expected to fail without error handling; ``--runxfail`` shows how (docs/benchmarks.md).
pytestmark = pytest.mark.xfail(
    UcxSettings().ucx_error_handling == "off",
    reason="without error handling a dying peer may abort the puller",
)


@pytest.fixture(scope="module")
def live(run: asyncio.Runner) -> Iterator[PeerProcess]:
    server = PeerProcess("ucx", "--blocks", str(BIG))
    yield server
    run.run(asyncio.to_thread(server.stop))


def start_puller(server: PeerProcess, *args: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tests.transfer.puller", "ucx", server.address.hex()]
    cmd += ["--blocks", str(BIG), "--timeout", str(PULL_TIMEOUT_S), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if read_line(proc, 30.0) != "PULLING":
        proc.kill()
        raise RuntimeError("the puller did not start pulling")
    return proc


@pytest.mark.parametrize(
    ("lease", "kill_after_s"),
    [(LEASE, 0.2), ("slow", SLOW_S / 3)],
    ids=["while-blocks-stream", "while-the-server-answers"],
)
def test_server_killed_mid_pull_fails_that_pull_not_the_puller(
    live: PeerProcess, lease: str, kill_after_s: float
) -> None:
    # Streaming: the puller is most likely inside its read of the server's memory. Answering:
    # the server dies before sending anything, which only a keepalive round can tell.
    doomed = PeerProcess("ucx", "--blocks", str(BIG))
    try:
        puller = start_puller(doomed, "--lease", lease, "--then", live.address.hex())
        try:
            time.sleep(kill_after_s)  # where in the pull the kill lands: the scenario's timing
            doomed.kill()
            killed_at = time.monotonic()
            failed = read_line(puller, PULL_TIMEOUT_S + 5.0)
            noticed_s = time.monotonic() - killed_at
            rest, _ = puller.communicate(timeout=20.0)
        finally:
            puller.kill()
    finally:
        doomed.kill()
    # All three at once, so that a failure says what the puller saw: its exit status, whether
    # its pull failed in time because the server was gone, and whether a live server's pull
    # then worked.
    seen = (puller.returncode, "gone" in failed and noticed_s < NOTICED_WITHIN_S, rest.strip())
    assert seen == (0, True, "THEN OK"), f"{failed!r} {noticed_s:.1f} s after the kill"


def test_puller_killed_mid_pull_leaves_the_server_serving(
    run: asyncio.Runner, live: PeerProcess
) -> None:
    puller = start_puller(live)
    time.sleep(0.2)  # the kill lands mid-pull: the scenario's timing, not a wait
    puller.kill()
    puller.wait(10)
    client = create_client("ucx", timeout_s=PULL_TIMEOUT_S)
    dest = [np.zeros(BLOCK, dtype=np.uint8) for _ in range(BIG)]
    for _ in range(3):
        assert run.run(client.pull(live.address, LEASE, list(range(BIG)), dest)) == BIG * BLOCK
    assert live.proc.poll() is None


def test_a_failed_endpoint_is_dropped_and_its_address_refused(run: asyncio.Runner) -> None:
    doomed = PeerProcess("ucx")
    client = create_client("ucx", timeout_s=PULL_TIMEOUT_S)
    endpoints = load_ucx().endpoints
    address = worker_address_of(doomed.address)
    dest = [np.zeros(BLOCK, dtype=np.uint8) for _ in range(2)]
    try:
        run.run(client.pull(doomed.address, LEASE, [0, 1], dest))
        assert address in endpoints
    finally:
        doomed.kill()  # idle: nothing in flight, so only a keepalive round can tell
    start = time.monotonic()
    with pytest.raises(TransferError, match="gone"):
        run.run(client.pull(doomed.address, LEASE, [0, 1], dest))
    assert time.monotonic() - start < NOTICED_WITHIN_S
    assert address not in endpoints
    start = time.monotonic()
    with pytest.raises(TransferError, match="gone"):  # refused at once, no new endpoint
        run.run(client.pull(doomed.address, LEASE, [0, 1], dest))
    # Well under a keepalive round (a second), with room for a busy host.
    assert time.monotonic() - start < 0.5
    assert address not in endpoints
