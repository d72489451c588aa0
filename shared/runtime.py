"""Runs a service until SIGTERM or SIGINT, then lets it drain."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def setup_logging(service: str) -> None:
    level = os.environ.get("CRESCENT_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s",
    )


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
    logging.getLogger(name).info("%s ready", name)
    await stop.wait()
    logging.getLogger(name).info("%s stopping", name)
    await service.stop()
