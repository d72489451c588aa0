"""Wires the gateway: settings, model folder and tokenizer, the bus, the app, uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from services.gateway.api import Gateway, build_app
from services.gateway.auth import ApiKeys
from services.gateway.config import GatewaySettings
from services.gateway.dispatch import Dispatcher
from services.gateway.metrics import GatewayMetrics
from services.gateway.requests import RequestBuilder
from services.gateway.service import Completions
from shared.bus import Bus
from shared.model.files import resolve_model
from shared.model.tokenizer import Tokenizer
from shared.runtime import setup_logging

log = logging.getLogger("services.gateway")


class GatewayService:
    """The assembled gateway: owns the bus connection and the app built around it."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.bus: Bus | None = None
        self.dispatcher: Dispatcher | None = None
        self.gateway: Gateway | None = None

    async def start(self) -> FastAPI:
        s = self.settings
        files = resolve_model(s.model, s.cache_dir)
        tokenizer = Tokenizer.from_dir(files.path)
        self.bus = await connect_bus(s.nats_url, s.nats_connect_timeout_s)
        self.dispatcher = Dispatcher(self.bus)
        builder = RequestBuilder(
            tokenizer,
            s.served_model_name or files.config.model_id,
            s.max_model_len or files.config.max_position_embeddings,
            s.max_n,
        )
        completions = Completions(
            self.dispatcher, tokenizer, s.first_token_timeout_s, s.request_timeout_s
        )
        self.gateway = gateway = Gateway(
            builder=builder,
            completions=completions,
            keys=ApiKeys(s.tenants_by_key),
            metrics=GatewayMetrics(),
            max_request_bytes=s.max_request_bytes,
            created=int(time.time()),
        )
        log.info("serving %s (context %d tokens)", builder.model_name, builder.max_model_len)
        return build_app(gateway)

    async def stop(self) -> None:
        """Publishes the aborts still pending, then drains and closes the bus connection."""
        if self.dispatcher is not None:
            await self.dispatcher.drain()
        if self.bus is not None:
            await self.bus.close()


async def connect_bus(url: str, timeout_s: float) -> Bus:
    try:
        # The client retries forever on its own; the deadline turns that into a clear failure.
        return await asyncio.wait_for(Bus.connect(url, "crescent-gateway"), timeout_s)
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
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="off",
        log_config=None,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
    )
    server = _Server(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _request_exit, server)
    try:
        await server.serve()
    finally:
        await service.stop()
        log.info("gateway stopped")


def _request_exit(server: uvicorn.Server) -> None:
    # A second signal skips the wait for in-flight requests.
    server.force_exit = server.should_exit
    server.should_exit = True


def main() -> None:
    setup_logging("gateway")
    settings = GatewaySettings()
    asyncio.run(serve(settings))
