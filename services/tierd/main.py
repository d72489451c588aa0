"""Wires tierd: settings, stores, catalogue session, bus subscriptions, transfer server, the
sink, upkeep and heartbeat tasks, and the ops port."""

from __future__ import annotations

import logging
import uuid

from prometheus_client import CollectorRegistry

from services.tierd.catalogue import TierCatalogue
from services.tierd.config import MB, TierdSettings
from services.tierd.handlers import UPKEEP_S, TierdHandlers
from services.tierd.holdings import NVME, S3, Holdings
from services.tierd.limits import Limits
from services.tierd.metrics import TierdMetrics
from services.tierd.nvme import NvmeStore
from services.tierd.policy import make_policy
from services.tierd.reads import TierReader
from services.tierd.s3 import S3Store
from services.tierd.sinker import Sinker, SinkPolicy
from services.tierd.staging import Staging
from services.tierd.tiering import Tiering
from shared import subjects
from shared.bus import Bus, NatsBus
from shared.cluster_messages import (
    CorruptBlocks,
    LeaseRelease,
    NodeStatus,
    PinRequest,
    PrefetchRequest,
)
from shared.heartbeat import Heartbeat
from shared.kv.block_file import BlockHeader
from shared.kv.hashing import quota_key, scope_salt
from shared.kv.keep_watch import KeepWatch
from shared.kv.seal import BlockSeal
from shared.kv_event_feed import KvEventFeed
from shared.lifecycle import Lifecycle
from shared.ops_http import OpsServer
from shared.rpc.client import CacheMetaClient
from shared.rpc.types import TierCapacity
from shared.runtime import run_service
from shared.transfer.base import TransferServer, create_server

log = logging.getLogger(__name__)


class TierdService:
    """Owns one host's tier daemon: its stores, catalogue session, bus connection, transfer
    server, and the lifecycle that runs their tasks and stops them, last started first.
    ``bus`` replaces the NATS connection (tests)."""

    def __init__(self, settings: TierdSettings, bus: Bus | None = None) -> None:
        s = self.settings = settings
        self.node_id = s.resolved_node_id()
        self.host_id = s.resolved_host_id()
        self.epoch = uuid.uuid4().hex[:16]
        self._bus = bus
        self.registry = CollectorRegistry()
        self.lifecycle = Lifecycle("tierd", self.registry)
        self.ops: OpsServer | None = None
        s3_config = s.s3_config()
        nvme_seal = BlockSeal(s.cache_secret, NVME, encrypt=s.nvme_encrypt)
        self.nvme = NvmeStore(
            s.nvme_dir, s.nvme_capacity_mb * MB, fsync=s.nvme_fsync, seal=nvme_seal
        )
        s3_seal = BlockSeal(s.cache_secret, S3, encrypt=s.s3_encrypt)
        self.s3 = S3Store(s3_config, s3_seal) if s3_config is not None else None
        self.holdings = Holdings(make_policy(s.eviction_policy))
        tiers = (NVME, S3) if self.s3 is not None else (NVME,)
        self.client = CacheMetaClient(s.cachemeta_url, token=s.cachemeta_token_value())
        self.catalogue = TierCatalogue(
            self.client, self.node_id, self._contents, self._capacities, tiers,
            s.heartbeat_interval_s,
        )  # fmt: skip
        self.tiering = Tiering(self.nvme, self.s3, self.holdings, self.catalogue, _limits(s))
        self.reader = TierReader(self.tiering)
        self.keeps = KeepWatch(self.client, self._follow_keeps)
        if self.s3 is not None:
            self.lifecycle.on_stop("s3", self.s3.close)
        self.lifecycle.on_stop("catalogue", self.catalogue.leave)
        self.staging = Staging(s.staging_mb * MB, s.lease_ttl_s)
        self.server: TransferServer = create_server(
            s.transfer, self.staging.provide, s.transfer_host
        )

    async def start(self) -> None:
        s, life = self.settings, self.lifecycle
        await self.server.start()
        life.on_stop("transfer server", self.server.close)
        await self.tiering.reconcile()
        if self._bus is None:
            name = f"crescent-{self.node_id}"
            self._bus = await NatsBus.connect(s.nats_url, name, **s.connect_options())
        bus = self.bus = self._bus
        self.catalogue.events = KvEventFeed(bus, "tierd", self.node_id)
        self.handlers = handlers = TierdHandlers(
            self.node_id, self.host_id, self.epoch, self.tiering, self.reader, self.staging,
            s.transfer, self.server.address,
        )  # fmt: skip
        policy = SinkPolicy(s.sink_watermark, s.sink_interval_s, s.sink_batch)
        self.sinker = Sinker(
            bus, self.tiering, self.host_id, self.epoch, policy, self.nvme.seal.checksum
        )
        life.on_stop("sinker", self.sinker.close)
        life.on_stop("handlers", handlers.close)
        life.on_stop("bus", bus.close)  # first: no new work arrives while the rest stops
        node = self.node_id
        await bus.serve(subjects.peer_pins(node), PinRequest, handlers.on_pin)
        await bus.subscribe(subjects.lease_releases(node), LeaseRelease, handlers.on_release)
        await bus.subscribe(subjects.prefetches(node), PrefetchRequest, handlers.on_prefetch)
        await bus.subscribe(subjects.corrupt_reports(node), CorruptBlocks, handlers.on_corrupt)
        for role in ("prefill", "decode"):
            await bus.watch(subjects.heartbeats(role, "*"), NodeStatus, self.sinker.on_heartbeat)
        catalogue = self.catalogue
        life.every("catalogue", catalogue.heartbeat_interval_s, catalogue.tick)
        life.every("sinker", policy.interval_s, self.sinker.sink_round)
        life.every("upkeep", UPKEEP_S, handlers.upkeep)
        life.every("keeps", self.keeps.interval_s, self.keeps.poll)
        heart = Heartbeat(bus, s.heartbeat_interval_s, handlers.status, handlers.status_now)
        life.every("heartbeat", s.heartbeat_interval_s, heart.beat)
        if s.metrics_port is not None:
            metrics = TierdMetrics(
                node, self.tiering, self.reader, self.sinker, self.staging, s.eviction_policy
            )
            self.registry.register(metrics)
            self.ops = OpsServer(
                s.metrics_host, s.metrics_port, lambda: bus.connected, self.registry
            )
            self.ops.start()
            life.on_stop("ops server", self.ops.stop)
        await life.start()
        log.info("tierd %s serving host %s (NVMe %s)", node, self.host_id, s.nvme_dir)

    async def _follow_keeps(self, keeps: dict[bytes, float], asked_at: float) -> None:
        """The ledger moved: the blocks it keeps are spared from now on, the others not."""
        self.holdings.set_kept(keeps)

    def _contents(self, tier: str) -> list[BlockHeader]:
        return self.tiering.contents(tier)

    def _capacities(self) -> list[TierCapacity]:
        caps = [TierCapacity(NVME, self.nvme.capacity_bytes, self.nvme.used_bytes)]
        if self.s3 is not None:
            limit = self.settings.s3_capacity_mb * MB
            caps.append(TierCapacity(S3, limit, self.s3.used_bytes))
        return caps

    async def stop(self) -> None:
        """Ends the tasks, then runs the steps ``start`` registered, last started first."""
        await self.lifecycle.stop()


def _limits(s: TierdSettings) -> Limits:
    secret = s.cache_secret.encode()
    quotas = {quota_key(scope_salt(secret, t)): b for t, b in s.tenant_quotas().items()}
    capacity = s.nvme_capacity_mb * MB
    return Limits(
        nvme_high_bytes=int(capacity * s.nvme_high_watermark),
        nvme_low_bytes=int(capacity * s.nvme_low_watermark),
        s3_capacity_bytes=s.s3_capacity_mb * MB,
        ttl_s=s.block_ttl_s,
        default_quota_bytes=s.tenant_quota_mb * MB,
        quotas=quotas,
    )


def main() -> None:
    settings = TierdSettings()

    async def build() -> TierdService:
        return TierdService(settings)

    run_service("tierd", build)
