"""Wires kvindex: settings, the bus and its subscription to every publisher's KV events, the
index, the HTTP port of the prefix queries (uvicorn), its heartbeat (so status pages list it)
and the ops port."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from prometheus_client import CollectorRegistry

from services.kvindex.api import build_app
from services.kvindex.config import KvIndexSettings
from services.kvindex.handlers import KvEventHandlers
from services.kvindex.index import KvIndex
from services.kvindex.metrics import KvIndexMetrics
from shared import subjects
from shared.bus import Bus, NatsBus
from shared.cluster_messages import NodeStatus
from shared.heartbeat import Heartbeat
from shared.kv_events import KvEventFrame
from shared.lifecycle import Lifecycle
from shared.ops_http import OpsServer
from shared.runtime import run_service
from shared.task_policy import OnError

log = logging.getLogger("kvindex")


class _Server(uvicorn.Server):
    """uvicorn without signal handlers of its own: the service's runner owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class KvIndexService:
    """Owns the index, the bus connection, the HTTP server and the lifecycle that stops them,
    last started first. Invariant: between ``start`` and ``stop`` every frame on the KV events
    subjects is folded into ``index`` and queries are answered on ``port``. ``bus`` replaces
    the NATS connection (tests)."""

    def __init__(self, settings: KvIndexSettings, bus: Bus | None = None) -> None:
        self.settings = settings
        self.index = KvIndex(
            settings.kvindex_resync_s,
            settings.kvindex_max_blocks_per_view,
            settings.kvindex_max_publishers,
        )
        self.registry = CollectorRegistry()
        self.lifecycle = Lifecycle("kvindex", self.registry)
        self._bus = bus
        self.epoch = uuid.uuid4().hex[:16]
        self.port = 0
        self.http: _Server | None = None
        self._socket: socket.socket | None = None

    async def start(self) -> None:
        s, life = self.settings, self.lifecycle
        # Bound before anything else: a taken port fails the start, not a task.
        self._socket = sock = _listen(s.kvindex_host, s.kvindex_port, s.kvindex_port_fallback)
        life.on_stop("http socket", sock.close)
        self.port = sock.getsockname()[1]
        if s.kvindex_port_file is not None:
            _write_port(s.kvindex_port_file, self.port)
        if self._bus is None:
            name = f"crescent-{s.node_id}"
            self._bus = await NatsBus.connect(s.nats_url, name, **s.connect_options())
        bus = self._bus
        life.on_stop("bus", bus.close)
        self.handlers = handlers = KvEventHandlers(self.index, bus)
        await bus.watch(subjects.KV_EVENTS_ALL, KvEventFrame, handlers.on_frame)
        heart = Heartbeat(bus, s.heartbeat_interval_s, self._status, self.status)
        life.every("heartbeat", s.heartbeat_interval_s, heart.beat)
        app = build_app(self.index, s.cache_secret, s.cachemeta_token_value())
        config = uvicorn.Config(
            app, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=2
        )
        self.http = _Server(config)
        life.run("http", self._serve_http, on_error=OnError.FATAL)
        life.on_stop("http server", self._stop_http)
        if s.metrics_port is not None:
            self.registry.register(KvIndexMetrics(self.index, handlers))
            ops = OpsServer(s.metrics_host, s.metrics_port, self.healthy, self.registry)
            ops.start()
            life.on_stop("ops server", ops.stop)
        await life.start()
        log.info("kvindex answering prefix queries on %s:%d", s.kvindex_host, self.port)

    def healthy(self) -> bool:
        return self.lifecycle.running and self._bus is not None and self._bus.connected

    def status(self) -> NodeStatus:
        """kvindex's heartbeat: who it is and whether it is well (it takes no work)."""
        return NodeStatus(
            node_id=self.settings.node_id,
            role="kvindex",
            epoch=self.epoch,
            healthy=self.healthy(),
            pid=os.getpid(),
        )

    async def _status(self) -> NodeStatus:
        return self.status()

    async def _serve_http(self) -> None:
        assert self.http is not None and self._socket is not None
        await self.http.serve(sockets=[self._socket])

    async def _stop_http(self) -> None:
        # The lifecycle cancels the serving task before its stop steps, which skips uvicorn's
        # own shutdown: run it here, so open connections end and the port is let go.
        if self.http is not None and self.http.started:
            self.http.should_exit = True
            await self.http.shutdown()

    async def stop(self) -> None:
        """Ends the HTTP task, then runs the steps ``start`` registered, last started first."""
        await self.lifecycle.stop()


def _listen(host: str, port: int, fallback: bool) -> socket.socket:
    """The query socket on ``host:port``; with ``fallback``, on a free port when that one is
    taken (two stacks starting at once may both have seen the default free)."""
    try:
        return socket.create_server((host, port))
    except OSError as exc:
        if not fallback or exc.errno != errno.EADDRINUSE:
            raise
    sock = socket.create_server((host, 0))
    log.warning("port %d is taken; kvindex listens on %d", port, sock.getsockname()[1])
    return sock


def _write_port(path: Path, port: int) -> None:
    """Writes ``port`` whole or not at all: a reader never sees half a number."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(f"{port}\n")
    partial.replace(path)


def main() -> None:
    settings = KvIndexSettings()

    async def build() -> KvIndexService:
        return KvIndexService(settings)

    run_service("kvindex", build)
