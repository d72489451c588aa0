"""Wires a prefill node: the node runtime, its prefix fetcher and the task subscription."""

from __future__ import annotations

import logging

from services.prefill.config import PrefillSettings
from services.prefill.handlers import PrefillRole
from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import PrefillTask
from shared.engine.engine import LLMEngine
from shared.node.prefix import PrefixFetcher
from shared.node.runtime import NodeRuntime
from shared.runtime import STOP_CLOSE_S, run_service

log = logging.getLogger(__name__)


class PrefillService:
    """Owns one prefill node. ``engine`` and ``bus`` replace what the settings would load
    or connect to (tests hand in a small engine and an in-memory bus)."""

    def __init__(
        self, settings: PrefillSettings, engine: LLMEngine | None = None, bus: Bus | None = None
    ) -> None:
        self.settings = settings
        self.node = NodeRuntime(settings, "prefill", engine=engine, bus=bus)
        self.role: PrefillRole | None = None

    async def start(self) -> None:
        node = self.node
        await node.start(self._make_role)
        assert self.role is not None
        await node.bus.serve(subjects.prefill_tasks(node.node_id), PrefillTask, self.role.on_task)
        log.info("prefill node %s serving (transfer %s)", node.node_id, self.settings.transfer)

    def _make_role(self, node: NodeRuntime) -> PrefillRole:
        fetcher = PrefixFetcher(node.bus, node.host, node.puller, direct=node.direct)
        self.role = PrefillRole(node.serving, fetcher)
        return self.role

    async def stop(self) -> None:
        await self.node.drain()
        if self.role is not None:
            await self.role.close()
        await self.node.stop()


def main() -> None:
    settings = PrefillSettings()

    async def build() -> PrefillService:
        return PrefillService(settings)

    # Draining may take its whole timeout; closing the bus, UCX and the catalogue a few seconds.
    run_service("prefill", build, stop_grace_s=settings.drain_timeout_s + STOP_CLOSE_S)
