"""Wires a decode node: the node runtime and the hand-off subscription."""

from __future__ import annotations

import logging

from services.decode.config import DecodeSettings
from services.decode.handlers import DecodeRole
from services.decode.local import LocalPrefills
from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import KVHandoff, PrefillTask
from shared.engine.engine import LLMEngine
from shared.node.prefix import PrefixFetcher
from shared.node.runtime import NodeRuntime
from shared.runtime import STOP_CLOSE_S, run_service

log = logging.getLogger(__name__)
#: Finishing sequences admit waiting hand-offs at once; this also covers room freed by aborts.
ADMIT_RETRY_S = 0.5


class DecodeService:
    """Owns one decode node. ``engine`` and ``bus`` replace what the settings would load or
    connect to (tests hand in a small engine and an in-memory bus)."""

    def __init__(
        self, settings: DecodeSettings, engine: LLMEngine | None = None, bus: Bus | None = None
    ) -> None:
        self.settings = settings
        self.node = NodeRuntime(settings, "decode", engine=engine, bus=bus)
        self.role: DecodeRole | None = None

    async def start(self) -> None:
        node = self.node
        await node.start(self._make_role)
        assert self.role is not None
        await node.bus.serve(subjects.decode_tasks(node.node_id), KVHandoff, self.role.on_handoff)
        if self.role.local is not None:
            subject = subjects.local_tasks(node.node_id)
            await node.bus.serve(subject, PrefillTask, self.role.local.on_task)
        role = self.role
        node.lifecycle.every("admit-retry", ADMIT_RETRY_S, role.retry_admission, immediately=False)
        log.info("decode node %s serving", node.node_id)

    def _make_role(self, node: NodeRuntime) -> DecodeRole:
        local = None
        if self.settings.local_prefill:
            fetcher = PrefixFetcher(node.bus, node.host, node.puller, direct=node.direct)
            local = LocalPrefills(node.serving, fetcher)
        self.role = DecodeRole(node.serving, local)
        return self.role

    async def stop(self) -> None:
        await self.node.drain()
        if self.role is not None:
            await self.role.close()
        await self.node.stop()


def main() -> None:
    settings = DecodeSettings()

    async def build() -> DecodeService:
        return DecodeService(settings)

    # Draining may take its whole timeout; closing the bus, UCX and the catalogue a few seconds.
    run_service("decode", build, stop_grace_s=settings.drain_timeout_s + STOP_CLOSE_S)
