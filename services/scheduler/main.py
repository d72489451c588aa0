"""Wires the scheduler: settings, bus, cachemeta client, subscriptions, heartbeat, metrics."""

from __future__ import annotations

import asyncio
import time
import uuid

from services.scheduler.cluster import ClusterView
from services.scheduler.config import SchedulerSettings
from services.scheduler.handlers import SchedulerHandlers
from services.scheduler.keeping import Keeper
from services.scheduler.lookup import PrefixIndex, PrefixLookup
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.options import SchedulerOptions
from services.scheduler.placer import PlacementOptions
from services.scheduler.saturation import Saturation, measure
from shared import subjects
from shared.bus import Bus, NatsBus, Subscription
from shared.cluster_messages import MAX_SATURATION_NODES, NodeStatus
from shared.heartbeat import Heartbeat
from shared.lifecycle import Lifecycle
from shared.messages import GenerateRequest
from shared.nats_auth import own_id
from shared.ops_http import OpsServer
from shared.runtime import run_service
from shared.secrets import secret_fingerprint

#: How long a stopping scheduler waits for requests it is still placing.
DRAIN_S = 2.0


class SchedulerService:
    """Owns the scheduler's connections. ``index`` replaces the cachemeta client that
    ``CRESCENT_CACHEMETA_URL`` would give, and ``bus`` the NATS connection (tests pass
    fakes)."""

    def __init__(
        self,
        settings: SchedulerSettings,
        index: PrefixIndex | None = None,
        bus: Bus | None = None,
    ) -> None:
        self.settings = settings
        self.scheduler_id = subjects.check_token(
            own_id(settings.scheduler_id, settings.nats_user)
            or f"scheduler-{uuid.uuid4().hex[:8]}",
            "scheduler id",
        )
        self.epoch = uuid.uuid4().hex[:16]
        self.bus = bus
        self.ops: OpsServer | None = None
        self.index = index
        self.metrics: SchedulerMetrics | None = None
        self.handlers: SchedulerHandlers | None = None
        self.requests: Subscription | None = None
        self.lifecycle: Lifecycle | None = None  # runs the heartbeat

    async def start(self) -> None:
        s = self.settings
        if self.bus is None:
            name = f"crescent-{self.scheduler_id}"
            self.bus = await NatsBus.connect(s.nats_url, name, **s.connect_options())
        bus = self.bus
        view = ClusterView(s.heartbeat_timeout_s, timing=s.step_times(), costs=s.cost_params())
        metrics = self.metrics = SchedulerMetrics(view, s.saturation_prompt_tokens)
        if self.index is None:
            self.index = _cachemeta_client(s)
        lookup = PrefixLookup(
            self.index,
            timeout_s=s.match_timeout_ms / 1000,
            retry_s=s.cachemeta_retry_s,
            on_fallback=metrics.fell_back,
        )
        options = SchedulerOptions(
            cache_secret=s.cache_secret,
            secret_fingerprint=secret_fingerprint(s.cache_secret),
            placement=PlacementOptions(
                slo_s=s.ttft_slo_s,
                tbt_slo_s=s.tbt_slo_s,
                round_robin=s.placement == "round_robin",
                local_prefill=s.local_prefill,
            ),
            ack_timeout_s=s.ack_timeout_ms / 1000,
            prefetch=s.prefetch,
            max_pending=s.scheduler_max_pending,
        )
        keeper = Keeper(self.index, s.keep_quota(), s.cache_secret)
        self.handlers = handlers = SchedulerHandlers(bus, view, lookup, metrics, options, keeper)
        metrics.watch_pending(lambda: handlers.gate.pending)
        if s.metrics_port is not None:
            self.ops = OpsServer(
                s.metrics_host, s.metrics_port, lambda: bus.connected, metrics.registry
            )
            self.ops.start()
        await bus.watch(subjects.HEARTBEATS_ALL, NodeStatus, handlers.on_heartbeat)
        await bus.subscribe_raw(subjects.DISCONNECTS, handlers.on_disconnect)
        warmup = s.heartbeat_timeout_s if s.warmup_s is None else s.warmup_s
        await self._learn_cluster(view, warmup)
        self.requests = await bus.serve(
            subjects.REQUESTS, GenerateRequest, handlers.on_request, queue=subjects.SCHEDULER_QUEUE
        )
        self.lifecycle = Lifecycle("scheduler", metrics.registry)
        heart = Heartbeat(bus, s.heartbeat_interval_s, self._status, self._status_now)
        self.lifecycle.every("heartbeat", s.heartbeat_interval_s, heart.beat)
        await self.lifecycle.start()

    async def _learn_cluster(self, view: ClusterView, timeout_s: float) -> None:
        """Listens to heartbeats before taking requests, so a replica that just started does
        not refuse them for want of a view the other replicas have; gives up after one
        heartbeat timeout (a cluster without nodes is then answered truthfully)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            now = time.monotonic()
            if view.targets("prefill", now) and view.targets("decode", now):
                return
            await asyncio.sleep(0.05)

    def _status_now(self) -> NodeStatus:
        return NodeStatus(node_id=self.scheduler_id, role="scheduler", epoch=self.epoch)

    async def _status(self) -> NodeStatus:
        status = self._status_now()
        if self.handlers is None:
            return status
        if self.settings.ttft_slo_s is not None:
            status.ttft_slo_s = self.settings.ttft_slo_s
            status.ttft_floor_s = min(self.handlers.ttft_floor(), 1e6)
        reading = self._saturation(self.handlers)
        hottest = sorted(reading.nodes.items(), key=lambda item: -item[1][1])
        status.saturation = {n: ratio for n, (_, ratio) in hottest[:MAX_SATURATION_NODES]}
        status.role_saturation = dict(reading.roles)
        return status

    def _saturation(self, handlers: SchedulerHandlers) -> Saturation:
        """Measures every node's saturation on the heartbeat's tick and sets the gauges."""
        reading = measure(
            handlers.view,
            handlers.feed.steps,
            handlers.metrics.typical.tokens(),
            self.settings.saturation_objectives(),
            time.monotonic(),
        )
        handlers.metrics.saturated(reading)
        return reading

    async def stop(self) -> None:
        if self.requests is not None:
            await self.requests.unsubscribe()
        if self.handlers is not None:
            await self._drain(self.handlers)
            await self.handlers.lookup.close()
        if self.lifecycle is not None:
            await self.lifecycle.stop()
        if self.index is not None:
            await self.index.close()
        if self.bus is not None:
            await self.bus.close()
        if self.ops is not None:
            self.ops.stop()

    async def _drain(self, handlers: SchedulerHandlers) -> None:
        """Lets the placements in progress finish (their requests are answered)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_S
        while handlers.gate.pending and loop.time() < deadline:
            await asyncio.sleep(0.02)


def _cachemeta_client(settings: SchedulerSettings) -> PrefixIndex | None:
    """The cachemeta client, only when a URL is configured (grpc is imported only then)."""
    if not settings.cachemeta_url:
        return None
    from shared.rpc.client import CacheMetaClient

    token = settings.cachemeta_token_value()
    client: PrefixIndex = CacheMetaClient(settings.cachemeta_url, token=token)
    return client


def main() -> None:
    settings = SchedulerSettings()

    async def build() -> SchedulerService:
        return SchedulerService(settings)

    run_service("scheduler", build)
