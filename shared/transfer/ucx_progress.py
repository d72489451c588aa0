"""Who moves a UCX worker forward, and when: the progress modes of the UCX transport.

UCX only advances a transfer inside ``ucp_worker_progress``: an arriving block, the reply to a
request, the acknowledgement that lets a send complete. Someone must call it, and how decides
both speed and idle cost (``bench/transfer.py``):

* ``adaptive`` (default): a task waiting on a request calls progress itself, in a tight loop
  that yields to the event loop between calls, for at most ``HOT_S``; blocks of a pull arrive
  back to back, so this covers a whole pull. Past that, and for waits with nothing in flight
  (a server waiting for the next request), the worker is armed and the loop sleeps in epoll
  until UCX's event file descriptor wakes it. Polling speed during pulls, no CPU when idle.
* ``polling``: every wait polls until its request completes, however long; a server's wait
  for requests then keeps a core busy for the life of the process. Slightly lower latency
  than ``adaptive`` (no epoll wake-up for a request), for hosts with cores to spare.
* ``thread``: ucxx's progress thread, sleeping in epoll when idle; waits check their request
  with a backing-off sleep. The slowest: each completion crosses threads twice.

All progress happens on one event loop's thread except in ``thread`` mode, so the worker is
never progressed from two threads at once.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import time
from collections.abc import Mapping
from typing import Any

from shared.transfer.base import TransferError

ENV_VAR = "CRESCENT_UCX_PROGRESS"
MODES = ("adaptive", "polling", "thread")
DEFAULT_MODE = "adaptive"
# Long enough for the gap between two blocks of one pull and for a peer's epoll wake-up; short
# enough that a stalled peer costs a few milliseconds of CPU, not a core.
HOT_S = 0.005
# How often a sleeping wait progresses the worker anyway. During a pull, often: a stalled
# send may need its sender to progress with no event to say so (a full shared-memory FIFO).
# Idle (a server waiting for requests), rarely: only in case UCX skips an event, which
# ucxx's own blocking mode guards against the same way.
STALLED_POLL_S = 0.001
IDLE_POLL_S = 0.5
_SPIN_S = 0.002
_FIRST_BACKOFF_S = 50e-6
_MAX_BACKOFF_S = 0.002


def mode_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The progress mode named by ``CRESCENT_UCX_PROGRESS`` (default ``adaptive``), validated."""
    env = os.environ if environ is None else environ
    mode = env.get(ENV_VAR, DEFAULT_MODE).strip().lower() or DEFAULT_MODE
    if mode not in MODES:
        raise TransferError(f"unknown {ENV_VAR} {mode!r}; expected one of {', '.join(MODES)}")
    return mode


class Progress:
    """Progresses one UCX worker for the waits of one event loop at a time.

    Owns the worker's epoll reader and the waits asleep on it. Invariant: whenever the loop
    may sleep in epoll (no wait is polling), the worker has been armed after its last
    progress, or a progress call is already scheduled; so no completion is left unseen.
    """

    def __init__(self, worker: Any, mode: str) -> None:
        self._worker = worker
        self.mode = mode
        self._loop: asyncio.AbstractEventLoop | None = None
        self._polling = 0
        self._asleep: dict[int, tuple[Any, asyncio.Future[None]]] = {}
        if mode == "thread":
            worker.start_progress_thread(polling_mode=False, epoll_timeout=1)
            # Stopped before the interpreter tears down, or UCX objects die on that thread.
            atexit.register(worker.stop_progress_thread)
        else:
            worker.init_blocking_progress_mode()

    def attach(self) -> None:
        """Progress on the running loop (each new loop needs attaching; the last one wins)."""
        loop = asyncio.get_running_loop()
        if self.mode == "thread" or loop is self._loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._worker.epoll_file_descriptor)
        self._loop = loop
        loop.add_reader(self._worker.epoll_file_descriptor, self._on_event)
        self._on_event()

    async def wait(self, request: Any, *, idle: bool = False) -> None:
        """Return once ``request`` has completed; raises its error, if any.

        ``idle``: the request may wait indefinitely for work to come (a server's receive for
        the next request) rather than being part of a pull in flight.
        """
        if not request.completed:
            if self.mode == "thread":
                await _backing_off(request)
            elif not await self._poll(request, None if self.mode == "polling" else HOT_S):
                await self._sleep(request, IDLE_POLL_S if idle else STALLED_POLL_S)
        request.check_error()

    async def _poll(self, request: Any, budget_s: float | None) -> bool:
        """Progress until ``request`` completes (True) or ``budget_s`` runs out (False)."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        self._polling += 1
        try:
            while True:
                self._progress()
                if request.completed:
                    return True
                if deadline is not None and time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0)
        finally:
            self._polling -= 1
            if not self._polling:
                self._arm()

    async def _sleep(self, request: Any, poll_s: float) -> None:
        assert self._loop is not None, "attach() first"
        key = id(request)
        while not request.completed:
            woken = self._loop.create_future()
            self._asleep[key] = (request, woken)
            try:
                self._arm()
                await asyncio.wait((woken,), timeout=poll_s)
            finally:
                del self._asleep[key]
            self._progress()

    def _progress(self) -> None:
        self._worker.progress()
        # A poller's progress can complete a sleeper's request without any event firing.
        for request, woken in self._asleep.values():
            if request.completed and not woken.done():
                woken.set_result(None)

    def _on_event(self) -> None:
        self._progress()
        self._arm()

    def _arm(self) -> None:
        # Arming fails while UCX holds unprocessed events; progress them on the next turn
        # instead of here, so a flood of events cannot hold the loop.
        if not self._polling and not self._worker.arm() and self._loop is not None:
            self._loop.call_soon(self._on_event)


async def _backing_off(request: Any) -> None:
    # Another thread progresses: spin briefly (blocks arrive back to back), then back off so
    # a long wait does not keep a core busy.
    spin_until = time.monotonic() + _SPIN_S
    delay = 0.0
    while not request.completed:
        await asyncio.sleep(delay)
        if time.monotonic() > spin_until:
            delay = min(max(2 * delay, _FIRST_BACKOFF_S), _MAX_BACKOFF_S)
