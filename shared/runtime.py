"""Runs a service until SIGTERM or SIGINT, then lets it drain."""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol

from shared import logs, tracing
from shared.tracing_settings import TracingSettings


class Service(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def setup_logging(service: str) -> None:
    """The service's logging, as ``CRESCENT_LOG_LEVEL`` and ``CRESCENT_LOG_FORMAT`` say, and
    its tracing where ``OTEL_EXPORTER_OTLP_ENDPOINT`` names a collector."""
    tracing.configure(service, TracingSettings().endpoint)
    logs.setup_logging(service, trace_ids=tracing.current_ids)


def settle_heap() -> None:
    """Moves everything a service built while starting (model, tokenizer, tables) out of the
    garbage collector's sight: a full collection then walks only what requests create, and no
    longer stalls the event loop for tens of milliseconds under load."""
    gc.collect()
    gc.freeze()


#: How long a service may take to stop, draining included, unless its wiring says otherwise.
STOP_GRACE_S = 60.0
#: What a node's stop may take beyond its drain: closing the bus, UCX and the catalogue.
STOP_CLOSE_S = 30.0


def run_service(
    name: str, build: Callable[[], Awaitable[Service]], stop_grace_s: float = STOP_GRACE_S
) -> None:
    """Builds and starts the service, waits for a stop signal, then stops it gracefully.
    A stop that overruns ``stop_grace_s`` is cut short (``StopWatchdog``). Whatever the
    service creates (catalogue, block files, logs) is private to its user (umask 077)."""
    os.umask(0o077)
    setup_logging(name)
    asyncio.run(_serve(name, build, StopWatchdog(name, stop_grace_s)))


class StopWatchdog:
    """Ends the process once a stop has taken ``grace_s``: a service that cannot finish
    stopping (a call that never returns, a thread the interpreter waits for at exit) would
    otherwise stay up, neither serving nor restarted by its supervisor. Before it exits it
    logs the error and dumps every thread's stack to stderr, which is what explains a hang."""

    def __init__(self, name: str, grace_s: float) -> None:
        self.name = name
        self.grace_s = grace_s
        self._timer: threading.Timer | None = None

    def arm(self) -> None:
        """Starts the countdown; a second call (a second signal) leaves it running."""
        if self._timer is not None:
            return
        self._timer = threading.Timer(self.grace_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        logging.getLogger(self.name).error(
            "%s did not stop within %.0f s; exiting with every thread's stack below",
            self.name,
            self.grace_s,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(1)


async def _serve(
    name: str, build: Callable[[], Awaitable[Service]], watchdog: StopWatchdog
) -> None:
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
    # Armed until the process ends: the interpreter's exit, which joins worker threads, too.
    watchdog.arm()
    await service.stop()
