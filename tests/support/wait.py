"""Waiting on what a test expects to happen, never on a guessed delay.

A test that sleeps "long enough" for a message to arrive fails, or passes without testing
anything, when another process holds the CPU. These helpers poll the observable condition
instead and only bound a hang: their deadlines are generous, so a busy host still passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

# Long enough for a host with one core held by another process; short enough to end a hang.
DEFAULT_TIMEOUT_S = 20.0
POLL_S = 0.02


class ConditionTimeout(AssertionError):
    """The awaited condition did not hold before the deadline; the message names it."""


def wait_until(
    predicate: Callable[[], bool], what: str, timeout_s: float = DEFAULT_TIMEOUT_S
) -> None:
    """Polls ``predicate`` from a synchronous test until it holds, or raises naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise ConditionTimeout(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_S)


async def wait_for_condition(
    predicate: Callable[[], bool | Awaitable[bool]],
    what: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Polls ``predicate`` (plain or async) on the running loop until it holds, or raises
    naming ``what``. Other tasks run between polls, so the awaited event can happen."""
    if not await holds_within(predicate, timeout_s):
        raise ConditionTimeout(f"timed out after {timeout_s:g} s waiting for {what}")


async def holds_within(
    predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float = DEFAULT_TIMEOUT_S
) -> bool:
    """Whether ``predicate`` comes to hold within ``timeout_s``. Where it should, the default
    deadline only bounds a hang; where it should not, a short ``timeout_s`` is the window in
    which it would have shown (a busy host can only make such a check pass more easily)."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = predicate()
        if not isinstance(held, bool):
            held = await held
        if held:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
