"""The real gateway (app, bus connection, uvicorn on 127.0.0.1) on a background loop."""

from __future__ import annotations

import concurrent.futures
import time

import uvicorn

from services.gateway.config import GatewaySettings
from services.gateway.http_server import server_config
from services.gateway.main import GatewayService
from tests.support.loop import BackgroundLoop


class ServedGateway:
    """One gateway serving HTTP on a free port until ``stop``.

    Owns the ``GatewayService`` and its uvicorn server, both running on ``loop``.
    """

    def __init__(self, loop: BackgroundLoop, settings: GatewaySettings) -> None:
        self.loop = loop
        self.service = GatewayService(settings.model_copy(update={"port": 0}))
        self._server: uvicorn.Server | None = None
        self._serving: concurrent.futures.Future[None] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> ServedGateway:
        app = self.loop.run(self.service.start(), timeout_s)
        limits = self.service.settings.connection_limits
        config = server_config(app, "127.0.0.1", 0, limits, log_level="warning")
        self._server = uvicorn.Server(config)
        self._serving = self.loop.submit(self._server.serve())
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if self._serving.done():
                self._serving.result()
            if time.monotonic() > deadline:
                raise TimeoutError("the gateway did not start")
            time.sleep(0.01)  # poll interval until the deadline
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        self._await_backends(deadline)
        return self

    def _await_backends(self, deadline: float) -> None:
        """Gives the gateway a moment to hear the backends' heartbeats (its readiness), as a
        load balancer would wait for ``/health``; a test without backends goes on anyway."""
        dispatcher = self.service.dispatcher
        until = min(deadline, time.monotonic() + 3)
        while dispatcher is not None and time.monotonic() < until:
            if dispatcher.readiness()[0]:
                return
            time.sleep(0.02)  # poll interval until the deadline

    def stop(self, timeout_s: float = 30) -> None:
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            self._serving.result(timeout_s)
        self.loop.run(self.service.stop(), timeout_s)
