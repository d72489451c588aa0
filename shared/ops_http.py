"""The operations port every non-HTTP service exposes: ``/healthz`` and Prometheus ``/metrics``.

A plain WSGI server on a daemon thread: it must answer even while the event loop is busy, and
it is not on the request path, so no web framework is needed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class OpsServer:
    """Owns the listening socket and its thread. ``healthy`` is polled per request."""

    def __init__(
        self,
        host: str,
        port: int,
        healthy: Callable[[], bool],
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        self.healthy = healthy
        self.registry = registry
        self.server: WSGIServer = make_server(host, port, self._app, handler_class=_QuietHandler)
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
