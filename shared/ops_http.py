"""The operations port every non-HTTP service exposes: ``/healthz`` and Prometheus ``/metrics``.

A plain WSGI server on daemon threads: it must answer even while the event loop is busy, and
it is not on the request path, so no web framework is needed. Each connection gets its own
thread, so an idle or slow client delays nobody else; a read timeout ends connections that send
nothing, and a cap on open connections keeps a flood of them from exhausting threads (past it a
new connection is closed at once rather than queued behind the others).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)
READ_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 128


class _QuietHandler(WSGIRequestHandler):
    server: _OpsWSGIServer

    def setup(self) -> None:
        super().setup()
        # Every read and write of this connection; a client silent this long is dropped.
        self.connection.settimeout(self.server.read_timeout_s)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _OpsWSGIServer(ThreadingMixIn, WSGIServer):
    """One daemon thread per connection, at most ``max_connections`` at once."""

    daemon_threads = True
    block_on_close = False  # stop() must not wait for a client that never speaks
    # The listen backlog (socketserver's default is 5): connections beyond it would wait out
    # TCP's SYN retries, seconds, before even being accepted.
    request_queue_size = MAX_CONNECTIONS

    def __init__(self, address: tuple[str, int], read_timeout_s: float, max_connections: int):
        self.read_timeout_s = read_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _QuietHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out or hung up is routine here, not worth a traceback.
        log.debug("ops connection from %s ended with an error", client_address, exc_info=True)


class OpsServer:
    """Owns the listening socket and its threads. ``healthy`` is polled per request.
    Invariant: between ``start`` and ``stop`` a ``/healthz`` is answered while fewer than
    ``max_connections`` other connections are open, however long those stay idle."""

    def __init__(
        self,
        host: str,
        port: int,
        healthy: Callable[[], bool],
        registry: CollectorRegistry = REGISTRY,
        *,
        read_timeout_s: float = READ_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.healthy = healthy
        self.registry = registry
        self.server = _OpsWSGIServer((host, port), read_timeout_s, max_connections)
        self.server.set_app(self._app)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="ops")

    def start(self) -> None:
        self.thread.start()
        log.info("ops endpoints on port %d (/healthz, /metrics)", self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _app(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            ok = self.healthy()
            start("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"unhealthy\n"]
        if path == "/metrics":
            start("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [generate_latest(self.registry)]
        start("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]
