"""Wires the gateway: settings, model folder and tokenizer, the bus, the app, uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import uvicorn
import uvloop
from fastapi import FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

from services.gateway.api import Gateway, build_app
from services.gateway.auth import ApiKeys
from services.gateway.completions import Completions
from services.gateway.config import GatewaySettings
from services.gateway.dispatch import Dispatcher, SubmitPolicy
from services.gateway.encode_pool import PooledTokenizer
from services.gateway.http_server import server_config
from services.gateway.metrics import GatewayMetrics
from services.gateway.recovery import RecoveryPolicy
from services.gateway.requests import RequestBuilder
from services.gateway.service import Limits
from services.gateway.status import StatusBoard
from services.gateway.status_routes import StatusFeed
from services.gateway.traced import TraceRequests
from shared import subjects
from shared.bus import Bus, NatsBus
from shared.cluster_messages import NodeStatus
from shared.heartbeat import Heartbeat
from shared.lifecycle import Lifecycle
from shared.liveness import Liveness
from shared.model.files import resolve_model
from shared.model.generation_config import sampling_defaults
from shared.nats_auth import own_id
from shared.runtime import STOP_CLOSE_S, StopWatchdog, settle_heap, setup_logging

log = logging.getLogger("services.gateway")


class GatewayService:
    """The assembled gateway: owns the bus connection, the app built around it, and the
    lifecycle that runs its heartbeat and stops its parts, last built first."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.gateway_id = subjects.check_token(
            own_id(settings.gateway_id, settings.nats_user) or f"gateway-{uuid.uuid4().hex[:8]}",
            "gateway id",
        )
        self.epoch = uuid.uuid4().hex[:16]
        self.bus: Bus | None = None
        self.dispatcher: Dispatcher | None = None
        self.gateway: Gateway | None = None
        self.tokenizer: PooledTokenizer | None = None
        self.metrics = GatewayMetrics()
        self.lifecycle = Lifecycle("gateway", self.metrics.registry)

    async def start(self) -> FastAPI:
        s = self.settings
        files = resolve_model(s.model, s.cache_dir)
        life = self.lifecycle
        self.tokenizer = tokenizer = PooledTokenizer.load(files.path)
        life.on_stop("tokenizer", tokenizer.close)
        defaults = sampling_defaults(files.path, s.generation_config, s.override_generation_config)
        self.bus = bus = await connect_bus(
            s.nats_url, f"crescent-{self.gateway_id}", s.nats_connect_timeout_s,
            s.connect_options(),
        )  # fmt: skip
        life.on_stop("bus", bus.close)
        liveness = Liveness(s.heartbeat_timeout_s, started_at=time.monotonic())
        submit = SubmitPolicy(s.no_scheduler_s, s.submit_timeout_s)
        self.dispatcher = Dispatcher(bus, self.gateway_id, liveness, submit)
        await self.dispatcher.start()
        # Publishes the aborts still pending before the bus closes.
        life.on_stop("dispatcher", self.dispatcher.drain)
        builder = RequestBuilder(
            tokenizer,
            s.served_model_name or files.config.model_id,
            s.max_model_len or files.config.context_length,
            s.max_n,
            s.tool_call_parser,
            defaults,
            s.grammar_check_timeout_s,
            tenant_terms=s.tenant_terms,
        )
        builder.grammars  # noqa: B018 - built now, not on the first structured request
        if builder.guard is not None:
            life.on_stop("guard", builder.guard.close)
        recovery = RecoveryPolicy(stall_timeout_s=s.stall_timeout_s, max_resumes=s.max_resumes)
        limits = Limits(s.first_token_timeout_s, s.request_timeout_s, recovery)
        completions = Completions(
            self.dispatcher, tokenizer, limits, s.max_in_flight, s.tenant_caps
        )
        self.gateway = gateway = Gateway(
            builder=builder,
            completions=completions,
            keys=ApiKeys(s.tenants_by_digest),
            metrics=self.metrics,
            max_request_bytes=s.max_request_bytes,
            created=int(time.time()),
        )
        heart = Heartbeat(bus, s.heartbeat_interval_s, self._status, self._status_now)
        life.every("heartbeat", s.heartbeat_interval_s, heart.beat)
        await life.start()
        log.info("serving %s (context %d tokens)", builder.model_name, builder.max_model_len)
        log.info("sampling defaults: %s", defaults.describe())
        if gateway.keys.open:
            why = "CRESCENT_DEV_MODE" if s.dev_mode else "CRESCENT_ALLOW_UNAUTHENTICATED"
            log.warning(
                "no API keys: every client on %s:%d is served as tenant 'default' (%s=true)",
                s.host, s.port, why,
            )  # fmt: skip
        app = build_app(gateway)
        # The status page: every service's heartbeat, and what this gateway served.
        feed = StatusFeed(StatusBoard(s.heartbeat_timeout_s), gateway.metrics, self._describe)
        await bus.watch(subjects.HEARTBEATS_ALL, NodeStatus, feed.on_heartbeat)
        _add_status_routes(app, feed)
        app.add_middleware(TraceRequests)
        return app

    def _describe(self) -> dict[str, object]:
        in_flight = len(self.dispatcher.in_flight) if self.dispatcher is not None else 0
        model = self.gateway.builder.model_name if self.gateway is not None else ""
        return {"id": self.gateway_id, "model": model, "in_flight": in_flight}

    def _status_now(self) -> NodeStatus:
        return NodeStatus(node_id=self.gateway_id, role="gateway", epoch=self.epoch)

    async def _status(self) -> NodeStatus:
        return self._status_now()

    async def stop(self) -> None:
        """Ends the heartbeat, then runs the steps ``start`` registered, last built first:
        the pending aborts are published before the bus closes."""
        await self.lifecycle.stop()


def _add_status_routes(app: FastAPI, feed: StatusFeed) -> None:
    """``GET /status`` and ``GET /dashboard`` (``services/gateway/status_routes.py``)."""

    @app.get("/status", include_in_schema=False)
    async def status() -> JSONResponse:
        return JSONResponse(feed.document(), headers={"Cache-Control": "no-store"})

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        return HTMLResponse(feed.page)


async def connect_bus(url: str, name: str, timeout_s: float, auth: dict[str, Any]) -> Bus:
    try:
        # The client retries forever on its own; the deadline turns that into a clear failure.
        return await asyncio.wait_for(NatsBus.connect(url, name, **auth), timeout_s)
    except TimeoutError:
        raise RuntimeError(f"NATS at {url} did not answer within {timeout_s:g} s") from None


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: it re-raises SIGTERM after shutting down, which
    would end the process before the bus is drained."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(settings: GatewaySettings) -> None:
    """Serves until SIGTERM/SIGINT; in-flight requests get ``drain_timeout_s`` to finish."""
    service = GatewayService(settings)
    app = await service.start()
    config = server_config(
        app,
        settings.host,
        settings.port,
        settings.connection_limits,
        # A log line per request costs the loop time every other request waits for.
        access_log=False,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
    )
    server = _Server(config)
    # uvicorn bounds the HTTP drain; the watchdog bounds the whole stop, the bus's drain too.
    watchdog = StopWatchdog("gateway", settings.drain_timeout_s + STOP_CLOSE_S)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _request_exit, server, watchdog)
    settle_heap()
    try:
        await server.serve()
    finally:
        await service.stop()
        log.info("gateway stopped")


def _request_exit(server: uvicorn.Server, watchdog: StopWatchdog) -> None:
    # A second signal skips the wait for in-flight requests.
    server.force_exit = server.should_exit
    server.should_exit = True
    watchdog.arm()


def main() -> None:
    setup_logging("gateway")
    settings = GatewaySettings()
    # uvloop: the gateway's loop carries every stream's tokens and every refusal; libuv's
    # loop does that with a fraction of asyncio's overhead.
    uvloop.run(serve(settings))
