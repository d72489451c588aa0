"""Wires a decode node: the node runtime, transfer clients, a transfer server for the peers that
pull its cached blocks (a chat's history), and subscriptions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import numpy as np

from services.decode.config import DecodeSettings
from services.decode.handlers import DecodeHandlers
from shared import subjects
from shared.cluster_messages import KVHandoff, LeaseRelease, NodeStatus, PinRequest
from shared.engine.types import RequestOutput
from shared.messages import AbortRequest
from shared.node.leases import LeaseTable
from shared.node.pins import PinServer
from shared.node.runtime import NodeRuntime
from shared.runtime import run_service
from shared.transfer.base import create_server

log = logging.getLogger(__name__)


class DecodeService:
    def __init__(self, settings: DecodeSettings) -> None:
        self.settings = settings
        self.node = NodeRuntime(settings, "decode")
        self.handlers: DecodeHandlers | None = None
        self.pins: PinServer | None = None
        self.server = create_server(settings.transfer, self._provide, settings.transfer_host)

    async def start(self) -> None:
        node = self.node
        await self.server.start()
        await node.start(self._on_outputs)
        self.handlers = h = DecodeHandlers(
            node.bus,
            node.async_engine,
            node.engine.runner.cache,
            self.settings.cache_secret,
            node.fetch_bandwidth,
        )
        node.describe = self._describe
        await node.bus.subscribe(subjects.decode_tasks(node.node_id), KVHandoff, h.on_handoff)
        await node.bus.subscribe(subjects.ABORTS, AbortRequest, h.on_abort)
        self.pins = pins = PinServer(
            node.async_engine,
            node.engine.runner.cache,
            LeaseTable(ttl_s=self.settings.lease_ttl_s),
            self.settings.transfer,
            self.server.address,
        )
        await node.bus.serve(subjects.peer_pins(node.node_id), PinRequest, pins.on_pin)
        await node.bus.subscribe(
            subjects.lease_releases(node.node_id),
            LeaseRelease,
            lambda release: pins.release(release.lease_id),
        )
        node.spawn(self._retry_waiting(h))
        node.spawn(self._expire_pins(pins))
        log.info("decode node %s serving", node.node_id)

    async def stop(self) -> None:
        await self.node.stop()
        if self.handlers is not None:
            await self.handlers.close()
        await self.server.close()

    async def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        if self.handlers is not None:
            await self.handlers.on_outputs(outputs)

    def _provide(self, lease_id: str, block_ids: Sequence[int]) -> list[np.ndarray] | None:
        return None if self.pins is None else self.pins.provide(lease_id, block_ids)

    def _describe(self, status: NodeStatus) -> None:
        status.transfer_kind = self.settings.transfer
        status.transfer_address = self.server.address
        status.kv_bytes_sent = self.server.bytes_sent
        if self.handlers is not None:
            status.kv_bytes_received = sum(c.bytes_received for c in self.handlers.clients.values())
            status.running_seqs += len(self.handlers.waiting)

    async def _retry_waiting(self, handlers: DecodeHandlers) -> None:
        # Finishing sequences trigger retries; this also covers room freed by aborts.
        while True:
            await asyncio.sleep(0.5)
            await handlers.retry_waiting()

    async def _expire_pins(self, pins: PinServer) -> None:
        while True:
            await asyncio.sleep(1.0)
            await pins.expire()


def main() -> None:
    settings = DecodeSettings()

    async def build() -> DecodeService:
        return DecodeService(settings)

    run_service("decode", build)
