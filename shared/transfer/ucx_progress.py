"""Who moves a UCX worker forward, and when: the progress modes of the UCX transport.

UCX only advances a transfer inside ``ucp_worker_progress``: an arriving block, the reply to a
request, the acknowledgement that lets a send complete. Someone must call it, and how decides
both speed and idle cost (``bench/transfer.py``):

* ``adaptive`` (default): a task waiting on requests calls progress itself, in a tight loop
  that yields to the event loop between calls, until ``HOT_S`` pass with none of them
  completing; blocks of a pull arrive back to back, so this covers a whole pull, however
  long. Past that, and for waits with nothing in flight
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
import time
from collections.abc import Callable, Sequence
from typing import Any

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
_UCS_OK = 0
_UCS_INPROGRESS = 1  # ucs_status_t of a request not yet completed
Alive = Callable[[], bool]


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
        self._asleep: dict[int, tuple[_Batch, asyncio.Future[None]]] = {}
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

    async def wait(
        self,
        requests: Sequence[Any],
        *,
        idle: bool = False,
        until: float | None = None,
        alive: Alive | None = None,
    ) -> None:
        """Return once every one of ``requests`` has completed; raises the first error, if any,
        as soon as every request before it has completed.

        One wait for a whole batch, not one per request: each wait that polls ends by arming
        the worker (system calls), and a pull's blocks complete back to back.
        ``idle``: the requests may wait indefinitely for work to come (a server's receive for
        the next request) rather than being part of a pull in flight.
        ``until``: a ``time.monotonic()`` deadline, past which the wait raises ``TimeoutError``
        and leaves the requests posted. Checked here rather than by ``asyncio.timeout``, whose
        timer costs a pull more than the clock reads this loop makes anyway.
        ``alive``: whether the peer that must answer is still there, read with the clock; once
        false, the wait raises ``ConnectionResetError``. Requests posted elsewhere than on the
        peer's endpoint (a pull's receives) do not fail with it by themselves.
        """
        batch = _Batch(requests)
        if not batch.done():
            limit = _Limit(until, alive)
            if self.mode == "thread":
                await _backing_off(batch, limit)
            elif not await self._poll(batch, None if self.mode == "polling" else HOT_S, limit):
                await self._sleep(batch, IDLE_POLL_S if idle else STALLED_POLL_S, limit)
        if batch.failed:
            requests[batch.next - 1].check_error()

    async def _poll(self, batch: _Batch, budget_s: float | None, limit: _Limit) -> bool:
        """Progress until ``batch`` completes (True) or ``budget_s`` passes with none of its
        requests completing (False): the budget is for the gap between two blocks, not for
        a whole pull, which may take longer than that."""
        give_up = time.monotonic() + (budget_s or 0.0)
        progress = self._progress
        self._polling += 1
        try:
            while True:
                progress()
                before = batch.next
                if batch.done():
                    return True
                now = time.monotonic()
                limit.check(now)
                if budget_s is not None:
                    if batch.next != before:
                        give_up = now + budget_s
                    elif now > give_up:
                        return False
                await asyncio.sleep(0)
        finally:
            self._polling -= 1
            if not self._polling:
                self._arm_soon()

    async def _sleep(self, batch: _Batch, poll_s: float, limit: _Limit) -> None:
        assert self._loop is not None, "attach() first"
        key = id(batch)
        until = limit.until
        while not batch.done():
            now = time.monotonic()
            limit.check(now)
            woken = self._loop.create_future()
            self._asleep[key] = (batch, woken)
            try:
                self._arm()
                timeout = poll_s if until is None else min(poll_s, until - now)
                await asyncio.wait((woken,), timeout=timeout)
            finally:
                del self._asleep[key]
            self._progress()

    def _progress(self) -> None:
        self._worker.progress()
        # A poller's progress can complete a sleeper's requests without any event firing.
        if self._asleep:
            for batch, woken in self._asleep.values():
                if not woken.done() and batch.done():
                    woken.set_result(None)

    def _on_event(self) -> None:
        self._progress()
        self._arm()

    def _arm_soon(self) -> None:
        # Arming takes system calls. Left to the next loop turn, it is off the path of the
        # caller that just got its completion, and skipped when that caller polls again at
        # once (the next pull), since nobody arms while a wait polls. A scheduled progress
        # call is as good as an armed worker (class invariant).
        if self._loop is None or self._loop.is_closed():
            self._arm()
        else:
            self._loop.call_soon(self._on_event)

    def _arm(self) -> None:
        # Arming fails while UCX holds unprocessed events; progress them on the next turn
        # instead of here, so a flood of events cannot hold the loop.
        if not self._polling and not self._worker.arm() and self._loop is not None:
            self._loop.call_soon(self._on_event)


class _Batch:
    """Requests waited on together, and how far along they are.

    Owns nothing but the index. Invariant: every request before ``next`` has completed, and
    all of them successfully unless ``failed`` (then the last of them failed); so a request's
    status is read until it is seen complete, not on every check of the batch.
    """

    __slots__ = ("failed", "next", "requests")

    def __init__(self, requests: Sequence[Any]) -> None:
        self.requests = requests
        self.next = 0
        self.failed = False

    def done(self) -> bool:
        """Whether waiting is over: every request has completed, or one has failed (which
        ends the wait at once, like waiting on each request in turn would)."""
        # One read of each request's status says both whether it has completed and whether
        # it failed: reads into ucxx cost a pull's tail more than anything else in this loop.
        requests, i, n = self.requests, self.next, len(self.requests)
        while i < n:
            status = requests[i].status
            if status == _UCS_INPROGRESS:
                break
            i += 1
            if status != _UCS_OK:
                self.next, self.failed = i, True
                return True
        self.next = i
        return i == n


class _Limit:
    """When a wait must stop short: its deadline, and the peer it depends on going away.

    Owns nothing. Invariant: ``check`` raises once either limit is reached, and keeps raising.
    """

    __slots__ = ("alive", "until")

    def __init__(self, until: float | None, alive: Alive | None) -> None:
        self.until = until
        self.alive = alive

    def check(self, now: float) -> None:
        if self.until is not None and now > self.until:
            raise TimeoutError
        if self.alive is not None and not self.alive():
            raise ConnectionResetError("the peer is gone")


async def _backing_off(batch: _Batch, limit: _Limit) -> None:
    # Another thread progresses: spin briefly (blocks arrive back to back), then back off so
    # a long wait does not keep a core busy.
    # A request completing starts the spin over: the next block is likely close behind.
    spin_until, delay, seen = 0.0, 0.0, -1
    while not batch.done():
        now = time.monotonic()
        limit.check(now)
        if batch.next != seen:
            seen, spin_until, delay = batch.next, now + _SPIN_S, 0.0
        elif now > spin_until:
            delay = min(max(2 * delay, _FIRST_BACKOFF_S), _MAX_BACKOFF_S)
        await asyncio.sleep(delay)
