"""Hosts the synchronous engine on one worker thread, driven from an asyncio service."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from shared.engine.engine import LLMEngine
from shared.engine.types import RequestOutput

log = logging.getLogger(__name__)
T = TypeVar("T")


class AsyncEngine:
    """Owns the engine thread. Every engine call runs on that one thread, so steps and
    requests never interleave inside the engine; the event loop only waits on futures.

    ``on_outputs`` receives each step's outputs on the event loop.
    """

    def __init__(
        self, engine: LLMEngine, on_outputs: Callable[[list[RequestOutput]], Awaitable[None]]
    ):
        self.engine = engine
        self._on_outputs = on_outputs
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.failed = False  # the last step raised; cleared by the next good one

    async def call(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` on the engine thread between steps and wakes the step loop."""
        result = await asyncio.get_running_loop().run_in_executor(self._pool, self._locked(fn))
        self._wake.set()
        return result

    async def call_now(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` while a step may be in its forward pass, under the engine's lock: only
        for bookkeeping that never touches a running sequence (load snapshots, catalogue
        events, pins and held blocks), which then waits for no forward pass."""
        result = await asyncio.to_thread(self._locked(fn))
        self._wake.set()
        return result

    def _locked(self, fn: Callable[[], T]) -> Callable[[], T]:
        def run() -> T:
            with self.engine.lock:
                return fn()

        return run

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="engine-loop")

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await self._task
        self._pool.shutdown(wait=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            # Cleared before the check, so a request added meanwhile is never slept through.
            self._wake.clear()
            has_work = await loop.run_in_executor(self._pool, self.engine.has_unfinished_requests)
            if not has_work:
                await self._wake.wait()
                continue
            try:
                outputs = await loop.run_in_executor(self._pool, self.engine.step)
            except Exception:
                # A failing step must not take the node down silently; log and keep serving.
                log.exception("engine step failed")
                self.failed = True
                await asyncio.sleep(0.1)
                continue
            self.failed = False
            if outputs:
                await self._on_outputs(outputs)
