"""Wires the scheduler: settings, bus, subscriptions."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.scheduler.config import SchedulerSettings
from services.scheduler.handlers import SchedulerHandlers
from services.scheduler.policy import ClusterView
from shared import subjects
from shared.bus import Bus
from shared.messages import GenerateRequest, NodeStatus
from shared.ops_http import OpsServer
from shared.runtime import run_service


class SchedulerService:
    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        self.bus: Bus | None = None
        self.ops: OpsServer | None = None

    async def start(self) -> None:
        self.bus = await Bus.connect(self.settings.nats_url, "crescent-scheduler")
        handlers = SchedulerHandlers(self.bus, ClusterView(self.settings.heartbeat_timeout_s))
        if self.settings.metrics_port is not None:
            registry = CollectorRegistry()
            registry.register(SchedulerMetrics(handlers))
            bus = self.bus
            self.ops = OpsServer(
                self.settings.metrics_host,
                self.settings.metrics_port,
                lambda: bus.connected,
                registry,
            )
            self.ops.start()
        await self.bus.subscribe(subjects.HEARTBEATS, NodeStatus, handlers.on_heartbeat)
        await self.bus.subscribe(
            subjects.REQUESTS, GenerateRequest, handlers.on_request, queue=subjects.SCHEDULER_QUEUE
        )

    async def stop(self) -> None:
        if self.bus is not None:
            await self.bus.close()
        if self.ops is not None:
            self.ops.stop()


class SchedulerMetrics(Collector):
    """Placement counters and live nodes, read from the handlers at scrape time."""

    def __init__(self, handlers: SchedulerHandlers) -> None:
        self.handlers = handlers

    def collect(self) -> Iterator[Metric]:
        placed = CounterMetricFamily("crescent_placements", "requests placed on nodes")
        placed.add_metric([], self.handlers.placed)
        rejected = CounterMetricFamily("crescent_rejections", "requests no node could take")
        rejected.add_metric([], self.handlers.rejected)
        live = GaugeMetricFamily(
            "crescent_live_nodes", "nodes with a recent heartbeat", labels=["role"]
        )
        now = time.monotonic()
        for role in ("prefill", "decode"):
            live.add_metric([role], len(self.handlers.view.live(role, now)))
        yield from (placed, rejected, live)


def main() -> None:
    settings = SchedulerSettings()

    async def build() -> SchedulerService:
        return SchedulerService(settings)

    run_service("scheduler", build)
