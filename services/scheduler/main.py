"""Wires the scheduler: settings, bus, subscriptions."""

from __future__ import annotations

from services.scheduler.config import SchedulerSettings
from services.scheduler.handlers import SchedulerHandlers
from services.scheduler.policy import ClusterView
from shared import subjects
from shared.bus import Bus
from shared.messages import GenerateRequest, NodeStatus
from shared.runtime import run_service


class SchedulerService:
    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.bus: Bus | None = None

    async def start(self) -> None:
        self.bus = await Bus.connect(self.settings.nats_url, "crescent-scheduler")
        handlers = SchedulerHandlers(self.bus, ClusterView(self.settings.heartbeat_timeout_s))
        await self.bus.subscribe(subjects.HEARTBEATS, NodeStatus, handlers.on_heartbeat)
        await self.bus.subscribe(
            subjects.REQUESTS, GenerateRequest, handlers.on_request, queue=subjects.SCHEDULER_QUEUE
        )

    async def stop(self) -> None:
        if self.bus is not None:
            await self.bus.close()


def main() -> None:
    settings = SchedulerSettings()

    async def build() -> SchedulerService:
        return SchedulerService(settings)

    run_service("scheduler", build)
