"""A service whose stop never finishes is ended by run_service's watchdog, with every
thread's stack in its output; one that stops in time exits cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from shared.runtime import StopWatchdog

SERVICE = textwrap.dedent(
    """
    import asyncio, sys, threading
    from shared.runtime import run_service

    HANG = sys.argv[1] == "hang"

    class Service:
        async def start(self):
            print("started", flush=True)

        async def stop(self):
            if HANG:
                # A worker blocked for good: the way a stuck close shows in a real node.
                await asyncio.to_thread(threading.Event().wait)

    async def build():
        return Service()

    run_service("watched", build, stop_grace_s=1.0)
    """
)


def run_and_stop(mode: str, source: str = SERVICE, stop: bool = True) -> tuple[int, str]:
    """Runs ``source`` in a child until it prints "started", sends it SIGTERM unless ``stop``
    is False, and returns its exit status and output."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", source, mode],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    if stop:
        proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    return proc.returncode, output


def test_a_stop_that_hangs_is_cut_short_and_shows_where_it_hung() -> None:
    status, output = run_and_stop("hang")
    assert status == 1
    assert "did not stop within 1 s" in output
    assert "Thread 0x" in output and "in wait" in output


def test_a_stop_in_time_exits_cleanly() -> None:
    status, output = run_and_stop("clean")
    assert status == 0
    assert "did not stop" not in output


def test_a_second_signal_leaves_the_countdown_running() -> None:
    watchdog = StopWatchdog("watched", grace_s=3600.0)
    watchdog.arm()
    first = watchdog._timer
    watchdog.arm()
    assert watchdog._timer is first
    assert first is not None
    first.cancel()
