"""Wires a prefill node: the node runtime, a transfer server, leases and subscriptions."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import numpy as np

from services.prefill.config import PrefillSettings
from services.prefill.handlers import PrefillHandlers
from services.prefill.peers import PeerFetcher
from shared import subjects
from shared.cluster_messages import LeaseRelease, NodeStatus, PinRequest, PrefillTask
from shared.engine.types import RequestOutput
from shared.messages import AbortRequest
from shared.node.leases import LeaseTable
from shared.node.runtime import NodeRuntime
from shared.runtime import run_service
from shared.transfer.base import create_server

log = logging.getLogger(__name__)


class PrefillService:
    def __init__(self, settings: PrefillSettings) -> None:
        self.settings = settings
        self.node = NodeRuntime(settings, "prefill")
        self.handlers: PrefillHandlers | None = None
        self.server = create_server(settings.transfer, self._provide, settings.transfer_host)

    async def start(self) -> None:
        await self.server.start()
        await self.node.start(self._on_outputs)
        node = self.node
        self.handlers = h = PrefillHandlers(
            node.bus,
            node.async_engine,
            node.engine.runner.cache,
            LeaseTable(ttl_s=self.settings.lease_ttl_s),
            node.node_id,
            self.settings.transfer,
            self.server.address,
            self.settings.cache_secret,
            PeerFetcher(
                node.bus, node.async_engine, node.engine.runner.cache, node.fetch_bandwidth
            ),
        )
        node.describe = self._describe
        await node.bus.subscribe(subjects.prefill_tasks(node.node_id), PrefillTask, h.on_task)
        await node.bus.subscribe(subjects.lease_releases(node.node_id), LeaseRelease, h.on_release)
        await node.bus.subscribe(subjects.ABORTS, AbortRequest, h.on_abort)
        await node.bus.serve(subjects.peer_pins(node.node_id), PinRequest, h.on_pin)
        node.spawn(self._expire_leases(h))
        log.info("prefill node %s serving (transfer %s)", node.node_id, self.settings.transfer)

    async def stop(self) -> None:
        await self.node.stop()
        if self.handlers is not None:
            await self.handlers.close()
        await self.server.close()

    async def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        if self.handlers is not None:
            await self.handlers.on_outputs(outputs)

    def _provide(self, lease_id: str, block_ids: Sequence[int]) -> list[np.ndarray] | None:
        return None if self.handlers is None else self.handlers.provide(lease_id, block_ids)

    def _describe(self, status: NodeStatus) -> None:
        status.transfer_kind = self.settings.transfer
        status.transfer_address = self.server.address
        status.kv_bytes_sent = self.server.bytes_sent
        if self.handlers is not None:
            status.kv_bytes_received = self.handlers.fetcher.bytes_received

    async def _expire_leases(self, handlers: PrefillHandlers) -> None:
        while True:
            await asyncio.sleep(1.0)
            await handlers.expire_leases()


def main() -> None:
    settings = PrefillSettings()

    async def build() -> PrefillService:
        return PrefillService(settings)

    run_service("prefill", build)
