"""Wires a prefill node: engine, transfer server, bus subscriptions, heartbeats, leases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import numpy as np

from services.prefill.config import PrefillSettings
from services.prefill.handlers import PrefillHandlers
from services.prefill.leases import LeaseTable
from shared import subjects
from shared.bus import Bus
from shared.engine.async_engine import AsyncEngine
from shared.engine.engine import RequestOutput
from shared.engine.factory import load_engine
from shared.messages import AbortRequest, LeaseRelease, NodeStatus, PrefillTask
from shared.node import heartbeat_loop, node_status
from shared.runtime import run_service
from shared.transfer.base import TransferServer, create_server

log = logging.getLogger(__name__)


class PrefillService:
    def __init__(self, settings: PrefillSettings) -> None:
        self.settings = settings
        self.node_id = settings.resolved_node_id("prefill")
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        s = self.settings
        loaded = await asyncio.to_thread(load_engine, s)
        self.engine = loaded.engine
        self.bus = await Bus.connect(s.nats_url, f"crescent-{self.node_id}")
        leases = LeaseTable(ttl_s=s.lease_ttl_s)
        self.async_engine = AsyncEngine(self.engine, self._on_outputs)
        self.handlers: PrefillHandlers | None = None
        self.server: TransferServer = create_server(s.transfer, self._provide, s.transfer_host)
        await self.server.start()
        self.handlers = PrefillHandlers(
            self.bus,
            self.async_engine,
            self.engine.runner.cache,
            leases,
            self.node_id,
            s.transfer,
            self.server.address,
        )
        self.async_engine.start()
        h = self.handlers
        await self.bus.subscribe(subjects.prefill_tasks(self.node_id), PrefillTask, h.on_task)
        await self.bus.subscribe(subjects.lease_releases(self.node_id), LeaseRelease, h.on_release)
        await self.bus.subscribe(subjects.ABORTS, AbortRequest, h.on_abort)
        self.tasks.append(
            asyncio.create_task(heartbeat_loop(self.bus, s.heartbeat_interval_s, self._status))
        )
        self.tasks.append(asyncio.create_task(self._expire_leases()))
        log.info("prefill node %s serving (transfer %s)", self.node_id, s.transfer)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.bus.close()
        await self.async_engine.stop()
        await self.server.close()

    async def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        if self.handlers is not None:
            await self.handlers.on_outputs(outputs)

    def _provide(self, lease_id: str, block_ids: Sequence[int]) -> list[np.ndarray] | None:
        return None if self.handlers is None else self.handlers.provide(lease_id, block_ids)

    async def _status(self) -> NodeStatus:
        load = await self.async_engine.call(self.engine.load)
        status = node_status(self.node_id, "prefill", load, self.engine.config.block_size)
        status.transfer_kind = self.settings.transfer
        status.transfer_address = self.server.address
        status.kv_bytes_sent = self.server.bytes_sent
        return status

    async def _expire_leases(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.handlers is not None:
                await self.handlers.expire_leases()


def main() -> None:
    settings = PrefillSettings()

    async def build() -> PrefillService:
        return PrefillService(settings)

    run_service("prefill", build)
