"""Runs a service until SIGTERM or SIGINT, then lets it drain."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol

from shared import logs, tracing


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def setup_logging(service: str) -> None:
    """The service's logging, as ``CRESCENT_LOG_LEVEL`` and ``CRESCENT_LOG_FORMAT`` say, and
    its tracing where ``OTEL_EXPORTER_OTLP_ENDPOINT`` names a collector."""
    tracing.configure(service)
    logs.setup_logging(service, trace_ids=tracing.current_ids)


def settle_heap() -> None:
    """Moves everything a service built while starting (model, tokenizer, tables) out of the
    garbage collector's sight: a full collection then walks only what requests create, and no
    longer stalls the event loop for tens of milliseconds under load."""
    gc.collect()
    gc.freeze()


def run_service(name: str, build: Callable[[], Awaitable[Service]]) -> None:
    """Builds and starts the service, waits for a stop signal, then stops it gracefully."""
    setup_logging(name)
    asyncio.run(_serve(name, build))


async def _serve(name: str, build: Callable[[], Awaitable[Service]]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service = await build()
    await service.start()
    settle_heap()
    logging.getLogger(name).info("%s ready", name)
    await stop.wait()
    logging.getLogger(name).info("%s stopping", name)
    await service.stop()
