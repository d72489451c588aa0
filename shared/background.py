"""Work started so that its caller need not wait for it, kept track of until it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    """Owns the tasks it started. Invariant: a task is held from ``spawn`` until it ends, so
    none is garbage-collected half-way, and ``close`` leaves none running."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def wait(self) -> None:
        """Lets every task started so far end on its own."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        """Cancels what still runs and waits for it to be gone."""
        self.cancel()
        await self.wait()
