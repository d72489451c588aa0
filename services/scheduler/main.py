"""Wires the scheduler: settings, bus, cachemeta client, subscriptions, metrics."""

from __future__ import annotations

from nats.aio.subscription import Subscription

from services.scheduler.cluster import ClusterView
from services.scheduler.config import SchedulerSettings
from services.scheduler.handlers import SchedulerHandlers
from services.scheduler.lookup import PrefixIndex, PrefixLookup
from services.scheduler.metrics import SchedulerMetrics
from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import NodeStatus
from shared.messages import GenerateRequest
from shared.ops_http import OpsServer
from shared.runtime import run_service

#: How long a stopping scheduler waits for requests it is still placing.
DRAIN_S = 2.0


class SchedulerService:
    """Owns the scheduler's connections. ``index`` replaces the cachemeta client that
    ``CRESCENT_CACHEMETA_URL`` would give (tests pass a fake)."""

    def __init__(self, settings: SchedulerSettings, index: PrefixIndex | None = None) -> None:
        self.settings = settings
        self.bus: Bus | None = None
        self.ops: OpsServer | None = None
        self.index = index
        self.metrics: SchedulerMetrics | None = None
        self.handlers: SchedulerHandlers | None = None
        self.requests: Subscription | None = None

    async def start(self) -> None:
        s = self.settings
        self.bus = await Bus.connect(s.nats_url, "crescent-scheduler")
        view = ClusterView(s.heartbeat_timeout_s, timing=s.step_times(), costs=s.cost_params())
        metrics = self.metrics = SchedulerMetrics(view)
        if self.index is None:
            self.index = _cachemeta_client(s)
        lookup = PrefixLookup(
            self.index,
            timeout_s=s.match_timeout_ms / 1000,
            retry_s=s.cachemeta_retry_s,
            on_fallback=metrics.fell_back,
        )
        handlers = SchedulerHandlers(
            self.bus,
            view,
            lookup,
            metrics,
            cache_secret=s.cache_secret,
            slo_s=s.ttft_slo_s,
            round_robin=s.placement == "round_robin",
        )
        self.handlers = handlers
        if s.metrics_port is not None:
            bus = self.bus
            self.ops = OpsServer(
                s.metrics_host, s.metrics_port, lambda: bus.connected, metrics.registry
            )
            self.ops.start()
        await self.bus.subscribe(subjects.HEARTBEATS, NodeStatus, handlers.on_heartbeat)
        self.requests = await self.bus.subscribe(
            subjects.REQUESTS, GenerateRequest, handlers.submit, queue=subjects.SCHEDULER_QUEUE
        )

    async def stop(self) -> None:
        if self.requests is not None:
            await self.requests.unsubscribe()
        if self.handlers is not None:
            await self.handlers.drain(DRAIN_S)
            await self.handlers.lookup.close()
        if self.index is not None:
            await self.index.close()
        if self.bus is not None:
            await self.bus.close()
        if self.ops is not None:
            self.ops.stop()


def _cachemeta_client(settings: SchedulerSettings) -> PrefixIndex | None:
    """The cachemeta client, only when a URL is configured (grpc is imported only then)."""
    if not settings.cachemeta_url:
        return None
    from shared.rpc.client import CacheMetaClient

    client: PrefixIndex = CacheMetaClient(settings.cachemeta_url)
    return client


def main() -> None:
    settings = SchedulerSettings()

    async def build() -> SchedulerService:
        return SchedulerService(settings)

    run_service("scheduler", build)
