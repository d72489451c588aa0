"""Wires what every model node runs besides its role: the engine host, the bus, the request
and lease tables, the block server and puller, heartbeats, the catalogue, the ops port, and
the upkeep that ends what nobody waits for any more. Decisions live in the parts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from shared import subjects
from shared.bus import Bus, NatsBus
from shared.cluster_messages import LeaseRelease, PinRequest, SinkDone, SinkRequest
from shared.engine.engine import LLMEngine
from shared.engine.probe import load_and_probe
from shared.engine.types import RequestOutput
from shared.heartbeat import Heartbeat
from shared.kv.checksum import BlockChecksum
from shared.kv_event_feed import KvEventFeed
from shared.lifecycle import Lifecycle
from shared.messages import AbortRequest, ReplayRequest
from shared.node.beats import NodeBeats
from shared.node.catalogue import CatalogueSync
from shared.node.context import NodeRole
from shared.node.direct import DirectReader, direct_reader
from shared.node.engine_host import EngineHost, engine_thread
from shared.node.keeps import NodeKeeps
from shared.node.leases import LeaseTable
from shared.node.metrics import NodeMetrics
from shared.node.pins import BlockServer
from shared.node.puller import BlockPuller
from shared.node.requests import RequestTable
from shared.node.serving import NodeServing
from shared.node.settings import NodeSettings
from shared.node.sink import SinkServer
from shared.node.upkeep import TICK_S, Upkeep
from shared.ops_http import OpsServer
from shared.secrets import secret_fingerprint
from shared.transfer.base import TransferServer, create_server

log = logging.getLogger(__name__)


class NodeRuntime:
    """Owns one prefill or decode node's parts and the tasks it runs for them.

    Invariants: every request the node accepted ends in ``requests`` as done, by finishing,
    failing with an error chunk, being aborted, or being handed over; its leases end with
    it. After ``stop`` nothing of it runs.
    """

    def __init__(
        self, settings: NodeSettings, role: str, *, engine: LLMEngine | None = None,
        bus: Bus | None = None,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.role_name = role
        self.node_id = settings.resolved_node_id(role)
        self.epoch = uuid.uuid4().hex[:16]
        self.checksum = BlockChecksum(settings.cache_secret)
        self._engine, self._bus = engine, bus
        self.metrics = NodeMetrics(self.node_id, role)
        self.registry = CollectorRegistry()
        self.registry.register(self.metrics)
        self.lifecycle = Lifecycle(self.node_id, self.registry)
        self.requests = RequestTable()
        self.leases = LeaseTable(settings.lease_ttl_s)
        self.metrics.outcomes = self.requests.outcomes
        self.ops: OpsServer | None = None
        self.catalogue: CatalogueSync | None = None
        self.direct: DirectReader | None = None
        self.server: TransferServer = create_server(
            settings.transfer, self._provide, settings.transfer_host
        )

    async def start(self, make_role: Callable[[NodeRuntime], NodeRole]) -> None:
        s = self.settings
        await self.server.start()
        thread = engine_thread()
        loader = thread if s.engine_thread_load else None  # None: asyncio's default
        engine = self._engine or await load_and_probe(s, s.startup_probe_tokens, loader)
        # Before any block is offered, pinned or published: they carry checksums in this key.
        engine.checksum = self.checksum
        if self._bus is None:
            name = f"crescent-{self.node_id}"
            self._bus = await NatsBus.connect(s.nats_url, name, **s.connect_options())
        self.bus: Bus = self._bus
        self.host = EngineHost(engine, self._on_outputs, s.step_timeout_s, thread)
        cache = self.host.cache
        self.puller = BlockPuller(cache, self.checksum, s.pull_timeout_s)
        self.puller.metrics = self.metrics
        self.blocks = BlockServer(self.host, cache, self.leases, s.transfer, self.server.address)
        self.direct = direct_reader(s, self.host)
        if self.direct is not None:
            self.direct.metrics = self.metrics
        sinks = SinkServer(
            self.host, self.leases, s.transfer, self.server.address, cache.layout.block_bytes
        )
        self.serving = NodeServing(
            s, self.node_id, self.epoch, self.requests, self.leases, self.host, self.bus,
            self.metrics, self.puller, self.blocks, sinks, self.server.address, self._beat_now,
        )  # fmt: skip
        self.beats = NodeBeats(
            self.serving, self.role_name, subjects.host_id(s.host_id),
            secret_fingerprint(s.cache_secret), self.puller, self.server, self.direct,
            self.metrics,
        )  # fmt: skip
        self.serving.role = make_role(self)
        self.host.start()
        await self._subscribe()
        life = self.lifecycle
        life.every("upkeep", TICK_S, Upkeep(self.serving).tick, immediately=False)
        heart = Heartbeat(self.bus, s.heartbeat_interval_s, self.beats.status, self.beats.bare)
        life.every("heartbeat", s.heartbeat_interval_s, heart.beat)
        if s.cachemeta_url:
            self._start_catalogue(s)
        if s.metrics_port is not None:
            self.ops = OpsServer(s.metrics_host, s.metrics_port, self.beats.healthy, self.registry)
            self.ops.start()
        self._stop_in_order()
        await life.start()

    async def _subscribe(self) -> None:
        bus, node, serving = self.bus, self.node_id, self.serving
        await bus.subscribe(subjects.ABORTS, AbortRequest, serving.on_abort)
        await bus.subscribe(subjects.lease_releases(node), LeaseRelease, serving.on_release)
        await bus.serve(subjects.peer_pins(node), PinRequest, self.blocks.on_pin)
        await bus.serve(subjects.replays(node), ReplayRequest, serving.on_replay)
        await bus.serve(subjects.sinks(node), SinkRequest, serving.sinks.on_sink)
        await bus.subscribe(subjects.sunk(node), SinkDone, serving.on_sunk)

    def _start_catalogue(self, s: NodeSettings) -> None:
        # Imported here: a node without cachemeta never loads grpc.
        from shared.rpc.client import CacheMetaClient

        client = CacheMetaClient(s.cachemeta_url, token=s.cachemeta_token_value())
        self.catalogue = CatalogueSync(
            client, self.host, self.node_id, self.role_name, self.host.block_bytes,
            sync_interval_s=s.catalogue_sync_s, heartbeat_interval_s=s.heartbeat_interval_s,
        )  # fmt: skip
        self.catalogue.events = KvEventFeed(self.bus, self.role_name, self.node_id)
        self.lifecycle.every("catalogue-sync", s.catalogue_sync_s, self.catalogue.tick)
        keeps = NodeKeeps(self.host, client)  # keeps dropped or extended elsewhere
        self.lifecycle.every("keep-watch", keeps.interval_s, keeps.tick)

    @property
    def engine(self) -> LLMEngine:
        return self.host.engine

    async def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        await self.serving.on_outputs(outputs)

    async def _beat_now(self) -> None:
        await self.beats.beat_now()

    def _provide(self, lease_id: str, block_ids: Any) -> Any:
        return self.blocks.provide(lease_id, block_ids)

    async def drain(self) -> None:
        """Takes no new work, then lets the role finish or hand over what it holds."""
        self.serving.draining = True
        with contextlib.suppress(Exception):
            await self.beats.beat_now()
        if self.catalogue is not None:
            # Peers that take over our requests find our blocks through the catalogue.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.catalogue.sync_once(), 2.0)
        if self.serving.role is not None:
            deadline = time.monotonic() + self.settings.drain_timeout_s
            try:
                await self.serving.role.drain(deadline)
            except Exception:
                log.exception("draining failed")

    def _stop_in_order(self) -> None:
        """Stop steps run in reverse: the bus first (nothing more is said), then the engine,
        the catalogue session, the puller, the block server and the ops port."""
        life, ops, catalogue = self.lifecycle, self.ops, self.catalogue
        if ops is not None:
            life.on_stop("ops", ops.stop)
        life.on_stop("block-server", self.server.close)
        life.on_stop("puller", self.puller.close)
        if catalogue is not None:
            life.on_stop("catalogue", catalogue.leave)
        life.on_stop("engine", self.host.stop)
        life.on_stop("bus", self.bus.close)

    async def stop(self) -> None:
        await self.lifecycle.stop()
