"""Runs a service until SIGTERM or SIGINT, then lets it drain."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


#: Libraries whose debug output would bury Crescent's own (botocore logs every S3 request's
#: headers, aiosqlite every statement): they stay at INFO when Crescent debugs.
QUIET_LIBRARIES = ("aiosqlite", "asyncio", "botocore", "aiobotocore", "grpc", "urllib3", "ucxx")


def setup_logging(service: str) -> None:
    level = os.environ.get("CRESCENT_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s",
    )
    if logging.getLogger().getEffectiveLevel() < logging.INFO:
        for name in QUIET_LIBRARIES:
            logging.getLogger(name).setLevel(logging.INFO)


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
