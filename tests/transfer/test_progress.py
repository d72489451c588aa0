"""UCX progress: choosing the mode, and an idle process in the default mode using no CPU."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest

from shared.transfer.base import TransferError, create_client
from shared.transfer.ucx_progress import mode_from_env
from tests.transfer.conftest import PeerProcess
from tests.transfer.peer import LEASE

IDLE_S = 1.0
# A process that polls while idle burns the whole IDLE_S; one asleep in epoll, next to none.
MAX_IDLE_CPU_S = 0.2


def test_mode_comes_from_the_environment_and_defaults_to_adaptive() -> None:
    assert mode_from_env({}) == "adaptive"
    assert mode_from_env({"CRESCENT_UCX_PROGRESS": " Polling "}) == "polling"
    assert mode_from_env({"CRESCENT_UCX_PROGRESS": "thread"}) == "thread"
    with pytest.raises(TransferError, match="CRESCENT_UCX_PROGRESS"):
        mode_from_env({"CRESCENT_UCX_PROGRESS": "busy"})


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, all threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(mode_from_env() != "adaptive", reason="only the default mode sleeps")
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_idle_server_and_client_sleep_between_pulls(run: asyncio.Runner) -> None:
    server = PeerProcess("ucx")
    try:
        client = create_client("ucx")
        dest = [np.zeros(1_474_560, dtype=np.uint8) for _ in range(4)]
        assert run.run(client.pull(server.address, LEASE, [0, 1, 2, 3], dest)) > 0
        server_cpu, own_cpu = cpu_seconds(server.proc.pid), time.process_time()
        run.run(asyncio.sleep(IDLE_S))  # this loop idles too, with its UCX worker attached
        assert cpu_seconds(server.proc.pid) - server_cpu < MAX_IDLE_CPU_S
        assert time.process_time() - own_cpu < MAX_IDLE_CPU_S
        # ...and wakes up for the next pull
        assert run.run(client.pull(server.address, LEASE, [3], dest[:1])) > 0
    finally:
        run.run(asyncio.to_thread(server.stop))
