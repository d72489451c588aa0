"""Changes that run one at a time and to their end: what keeps cachemeta's memory equal to its
database when a caller gives up half way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shared.lifecycle import Tasks

T = TypeVar("T")


class SerialChanges:
    """Owns a lock and the changes in flight under it.

    Invariant: changes run one at a time, each to its end even if its caller is cancelled
    (a change writes the database and then memory: stopping between the two would leave
    memory behind a committed change).
    """

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._tasks = Tasks("cachemeta changes")

    async def run(self, change: Callable[[], Awaitable[T]]) -> T:
        """Runs ``change`` alone and to its end, even if the caller stops waiting."""

        async def locked() -> T:
            async with self._lock:
                return await change()

        # Its caller takes its failure; one that stopped waiting leaves it unread.
        task = self._tasks.spawn(locked(), "change", awaited=True)
        return await asyncio.shield(task)

    async def drain(self) -> None:
        """Waits for the changes already started (at shutdown)."""
        await self._tasks.wait()
