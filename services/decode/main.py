"""Wires a decode node: the node runtime, transfer clients and subscriptions."""

from __future__ import annotations

import asyncio
import logging

from services.decode.config import DecodeSettings
from services.decode.handlers import DecodeHandlers
from shared import subjects
from shared.engine.types import RequestOutput
from shared.messages import AbortRequest, KVHandoff, NodeStatus
from shared.node_runtime import NodeRuntime
from shared.runtime import run_service

log = logging.getLogger(__name__)


class DecodeService:
    def __init__(self, settings: DecodeSettings) -> None:
        self.settings = settings
        self.node = NodeRuntime(settings, "decode")
        self.handlers: DecodeHandlers | None = None

    async def start(self) -> None:
        node = self.node
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
        node.spawn(self._retry_waiting(h))
        log.info("decode node %s serving", node.node_id)

    async def stop(self) -> None:
        await self.node.stop()
        if self.handlers is not None:
            await self.handlers.close()

    async def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        if self.handlers is not None:
            await self.handlers.on_outputs(outputs)

    def _describe(self, status: NodeStatus) -> None:
        if self.handlers is not None:
            status.kv_bytes_received = sum(c.bytes_received for c in self.handlers.clients.values())
            status.running_seqs += len(self.handlers.waiting)

    async def _retry_waiting(self, handlers: DecodeHandlers) -> None:
        # Finishing sequences trigger retries; this also covers room freed by aborts.
        while True:
            await asyncio.sleep(0.5)
            await handlers.retry_waiting()


def main() -> None:
    settings = DecodeSettings()

    async def build() -> DecodeService:
        return DecodeService(settings)

    run_service("decode", build)
