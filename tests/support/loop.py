"""An asyncio loop on a background thread, so synchronous tests can drive async services."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """Owns a thread that runs one event loop until ``close``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30) -> T:
        return self.submit(coro).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


_SHARED: BackgroundLoop | None = None


def shared_loop() -> BackgroundLoop:
    """The process's one loop for gRPC: grpc.aio binds to the first event loop it runs on, so
    every test that talks gRPC goes through this one. Lives until the process ends."""
    global _SHARED
    if _SHARED is None:
        _SHARED = BackgroundLoop()
    return _SHARED
