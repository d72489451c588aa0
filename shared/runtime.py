"""Runs a service until SIGTERM or SIGINT, then lets it drain; or until its lifecycle stops by
itself (a FATAL task failed), then stops it and exits non-zero."""

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
from shared.lifecycle import Lifecycle, awaited_task
from shared.tracing_settings import TracingSettings


class Service(Protocol):
    """What ``run_service`` runs. A service whose tasks run under a ``Lifecycle`` exposes it
    as ``lifecycle``, its own or its node's (``node.lifecycle``), once started: when that
    lifecycle stops by itself the process ends."""

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
    if not asyncio.run(_serve(name, build, StopWatchdog(name, stop_grace_s))):
        sys.exit(1)


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


def lifecycle_of(service: object) -> Lifecycle | None:
    """The lifecycle that runs the service's tasks: its own, or its node's."""
    for owner in (service, getattr(service, "node", None)):
        life = getattr(owner, "lifecycle", None)
        if isinstance(life, Lifecycle):
            return life
    return None


async def _serve(
    name: str, build: Callable[[], Awaitable[Service]], watchdog: StopWatchdog
) -> bool:
    """Serves until a signal (True) or until the service's lifecycle stops by itself (False);
    either way the service is stopped before it returns."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    service = await build()
    await service.start()
    settle_heap()
    logger = logging.getLogger(name)
    logger.info("%s ready", name)
    signalled = await _until_stopped(stop, lifecycle_of(service), logger)
    logger.info("%s stopping", name)
    # Armed until the process ends: the interpreter's exit, which joins worker threads, too.
    watchdog.arm()
    await service.stop()
    return signalled


async def _until_stopped(
    stop: asyncio.Event, life: Lifecycle | None, logger: logging.Logger
) -> bool:
    """Waits for a stop signal or for ``life`` to stop by itself; True for the signal."""
    signal_seen = awaited_task(stop.wait(), "stop signal")
    ended = awaited_task(life.wait(), "lifecycle") if life is not None else None
    waiting = {signal_seen} if ended is None else {signal_seen, ended}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waiting:
            task.cancel()
    if ended is None or not ended.done() or ended.cancelled():
        return True
    failure = ended.exception()
    if failure is None:
        logger.error("the service's tasks stopped by themselves; stopping")
    else:
        # The lifecycle logged the failure's traceback when it happened.
        logger.error("a fatal task failure stopped the service: %r", failure.__cause__)
    return False
