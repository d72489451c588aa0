"""Wires a decode node: engine, transfer clients, bus subscriptions, heartbeats."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from services.decode.config import DecodeSettings
from services.decode.handlers import DecodeHandlers
from shared import subjects
from shared.bus import Bus
from shared.engine.async_engine import AsyncEngine
from shared.engine.engine import RequestOutput
from shared.engine.factory import load_engine
from shared.messages import AbortRequest, KVHandoff, NodeStatus
from shared.node import heartbeat_loop, node_status
from shared.runtime import run_service

log = logging.getLogger(__name__)


class DecodeService:
    def __init__(self, settings: DecodeSettings) -> None:
        self.settings = settings
        self.node_id = settings.resolved_node_id("decode")
        self.tasks: list[asyncio.Task[None]] = []
        self.handlers: DecodeHandlers | None = None

    async def start(self) -> None:
        s = self.settings
        loaded = await asyncio.to_thread(load_engine, s)
        self.engine = loaded.engine
        self.bus = await Bus.connect(s.nats_url, f"crescent-{self.node_id}")
        self.async_engine = AsyncEngine(self.engine, self._on_outputs)
        self.handlers = DecodeHandlers(self.bus, self.async_engine, self.engine.runner.cache)
        self.async_engine.start()
        h = self.handlers
        await self.bus.subscribe(subjects.decode_tasks(self.node_id), KVHandoff, h.on_handoff)
        await self.bus.subscribe(subjects.ABORTS, AbortRequest, h.on_abort)
        beat = heartbeat_loop(self.bus, s.heartbeat_interval_s, self._status)
        self.tasks.append(asyncio.create_task(beat))
        self.tasks.append(asyncio.create_task(self._retry_waiting()))
        log.info("decode node %s serving", self.node_id)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.bus.close()
        await self.async_engine.stop()
        if self.handlers is not None:
            await self.handlers.close()

    async def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        if self.handlers is not None:
            await self.handlers.on_outputs(outputs)

    async def _status(self) -> NodeStatus:
        load = await self.async_engine.call(self.engine.load)
        status = node_status(self.node_id, "decode", load, self.engine.config.block_size)
        if self.handlers is not None:
            status.kv_bytes_received = sum(c.bytes_received for c in self.handlers.clients.values())
            status.running_seqs += len(self.handlers.waiting)
        return status

    async def _retry_waiting(self) -> None:
        # Finishing sequences trigger retries; this also covers room freed by aborts.
        while True:
            await asyncio.sleep(0.5)
            if self.handlers is not None:
                await self.handlers.retry_waiting()


def main() -> None:
    settings = DecodeSettings()

    async def build() -> DecodeService:
        return DecodeService(settings)

    run_service("decode", build)
