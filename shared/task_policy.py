"""What a named background task does between its runs: the schedule of a periodic tick, the
backoff of a restarted loop, and the error policies (``OnError``) that ``shared.lifecycle``
applies. No task is started here."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable

#: How long a restarted task waits after its first failure in a row; doubled per failure
#: up to ``RESTART_MAX_S``, so a task that fails at once on every start does not spin.
RESTART_MIN_S = 0.1
RESTART_MAX_S = 5.0
Interval = float | Callable[[], float]
Tick = Callable[[], Awaitable[object]]
Work = Callable[[], Awaitable[None]]


class OnError(enum.Enum):
    """What a task's failure does, besides being logged and counted."""

    RESTART = "restart"  # run the task again after a short backoff
    FATAL = "fatal"  # stop the whole service; ``wait`` raises
    LOG = "log"  # periodic tasks keep their schedule; a long-running one ends


class TaskFailed(Exception):
    """A task under ``OnError.FATAL`` failed; its error is the cause."""


#: Told of each failure: the task's name, the error, how many failures in a row; raises
#: ``TaskFailed`` under FATAL.
Failed = Callable[[str, Exception, int, OnError], None]


async def periodic(
    name: str,
    interval_s: Interval,
    tick: Tick,
    on_error: OnError,
    immediately: bool,
    failed: Failed,
) -> None:
    """``tick()`` every interval, measured start to start, until cancelled."""
    streak = 0
    if not immediately:
        await asyncio.sleep(seconds(interval_s))
    while True:
        started = time.monotonic()
        try:
            await tick()
            streak = 0
        except Exception as exc:
            streak += 1
            failed(name, exc, streak, on_error)
        await asyncio.sleep(max(0.0, seconds(interval_s) - (time.monotonic() - started)))


async def long_running(name: str, work: Work, on_error: OnError, failed: Failed) -> None:
    """``work()``, run again after a backoff each time it returns or raises (RESTART), until
    cancelled; under LOG it ends after its first end."""
    streak = 0
    while True:
        started = time.monotonic()
        try:
            await work()
            exc: Exception = RuntimeError(f"task {name} returned")
        except Exception as raised:
            exc = raised
        # A run that lasted past the longest backoff was not a failure in a row.
        streak = 1 if time.monotonic() - started > RESTART_MAX_S else streak + 1
        failed(name, exc, streak, on_error)
        if on_error is OnError.LOG:
            return
        await asyncio.sleep(min(RESTART_MAX_S, RESTART_MIN_S * 2 ** (streak - 1)))


def seconds(interval_s: Interval) -> float:
    return interval_s() if callable(interval_s) else interval_s
