"""UCX progress: choosing the mode, and an idle process in the default mode using no CPU."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest

from shared.transfer import ucx_progress
from shared.transfer.base import TransferError, create_client
from shared.transfer.ucx_settings import UcxSettings
from tests.transfer.conftest import PeerProcess
from tests.transfer.peer import LEASE

IDLE_S = 1.0
# A process that polls while idle burns the whole IDLE_S; one asleep in epoll, next to none.
MAX_IDLE_CPU_S = 0.2


def mode_from(environ: dict[str, str]) -> str:
    return UcxSettings.from_environ(environ).ucx_progress


def test_mode_comes_from_the_environment_and_defaults_to_adaptive() -> None:
    assert mode_from({}) == "adaptive"
    assert mode_from({"CRESCENT_UCX_PROGRESS": " Polling "}) == "polling"
    assert mode_from({"CRESCENT_UCX_PROGRESS": "thread"}) == "thread"
    assert mode_from({"CRESCENT_UCX_PROGRESS": ""}) == "adaptive"
    with pytest.raises(TransferError, match="CRESCENT_UCX_PROGRESS"):
        mode_from({"CRESCENT_UCX_PROGRESS": "busy"})


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, all threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(UcxSettings().ucx_progress != "adaptive", reason="only the default mode sleeps")
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_idle_server_and_client_sleep_between_pulls(run: asyncio.Runner) -> None:
    server = PeerProcess("ucx")
    try:
        client = create_client("ucx")
        dest = [np.zeros(1_474_560, dtype=np.uint8) for _ in range(4)]
        assert run.run(client.pull(server.address, LEASE, [0, 1, 2, 3], dest)) > 0
        server_cpu, own_cpu = cpu_seconds(server.proc.pid), time.process_time()
        # The idle time measured (this loop idles too, with its UCX worker attached).
        run.run(asyncio.sleep(IDLE_S))
        assert cpu_seconds(server.proc.pid) - server_cpu < MAX_IDLE_CPU_S
        assert time.process_time() - own_cpu < MAX_IDLE_CPU_S
        # ...and wakes up for the next pull
        assert run.run(client.pull(server.address, LEASE, [3], dest[:1])) > 0
    finally:
        run.run(asyncio.to_thread(server.stop))


class FakeRequest:
    """A request that the fake worker completes."""

    status = 1  # UCS_INPROGRESS until the fake worker completes it

    def check_error(self) -> None:
        return


class FakeWorker:
    """Just enough of a UCX worker for ``Progress``, with a clock of its own: each progress
    call takes ``step_s``, and every ``every``-th call completes the next request."""

    def __init__(self, requests: list[FakeRequest], step_s: float, every: int) -> None:
        self.requests = requests
        self.step_s = step_s
        self.every = every
        self.calls = 0
        self.now = 0.0
        self.read_fd, self.write_fd = os.pipe()  # never written: no UCX event ever fires
        self.epoll_file_descriptor = self.read_fd

    def monotonic(self) -> float:
        return self.now

    def init_blocking_progress_mode(self) -> None:
        return

    def progress(self) -> None:
        self.calls += 1
        self.now += self.step_s
        if self.calls % self.every == 0 and self.calls // self.every <= len(self.requests):
            self.requests[self.calls // self.every - 1].status = 0

    def arm(self) -> bool:
        return True


def test_a_batch_longer_than_the_polling_budget_polls_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 64 MiB pull takes longer than HOT_S, but its blocks land well within HOT_S of each
    # other: the wait must keep polling rather than fall asleep between blocks.
    requests = [FakeRequest() for _ in range(8)]
    worker = FakeWorker(requests, step_s=ucx_progress.HOT_S / 4, every=3)
    monkeypatch.setattr(ucx_progress, "time", worker)  # the module's clock only

    async def no_sleep(*_: object) -> None:
        raise AssertionError("the wait fell asleep between two completions")

    monkeypatch.setattr(ucx_progress.Progress, "_sleep", no_sleep)

    async def scenario() -> None:
        progress = ucx_progress.Progress(worker, "adaptive")
        progress.attach()
        await progress.wait(requests)

    try:
        asyncio.run(scenario())
    finally:
        os.close(worker.read_fd)
        os.close(worker.write_fd)
    assert all(r.status == 0 for r in requests)
    assert worker.now > 4 * ucx_progress.HOT_S


def test_a_wait_gives_up_once_its_peer_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # The requests never complete (the worker completes one in a million calls): only the
    # peer's endpoint failing can end the wait before its deadline, in either loop.
    requests = [FakeRequest() for _ in range(2)]
    worker = FakeWorker(requests, step_s=ucx_progress.HOT_S / 4, every=10**6)
    monkeypatch.setattr(ucx_progress, "time", worker)
    checks = 0

    def alive() -> bool:
        nonlocal checks
        checks += 1
        return checks < 50  # past the polling budget: the wait is asleep by then

    async def scenario() -> None:
        progress = ucx_progress.Progress(worker, "adaptive")
        progress.attach()
        with pytest.raises(ConnectionResetError):
            wait = progress.wait(requests, until=worker.now + 1e6, alive=alive)
            await asyncio.wait_for(wait, 5.0)  # real seconds: a wait that ignores alive fails

    try:
        asyncio.run(scenario())
    finally:
        os.close(worker.read_fd)
        os.close(worker.write_fd)
    assert checks == 50
