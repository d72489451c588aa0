"""What every model node runs besides its role: the engine host, the bus, the ledger, the block
server and puller, heartbeats, the catalogue, the ops port, and the upkeep that ends what
nobody waits for any more."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from shared import subjects, tracing
from shared.bus import Bus, NatsBus
from shared.cluster_messages import (
    LeaseRelease,
    NodeStatus,
    PinRequest,
    SinkDone,
    SinkRequest,
    TaskAck,
)
from shared.engine.engine import LLMEngine
from shared.engine.factory import load_engine
from shared.engine.probe import probe_speed, probe_tokens
from shared.engine.types import RequestOutput
from shared.errors import InvalidRequestError
from shared.heartbeat import heartbeat_loop
from shared.kv.checksum import BlockChecksum
from shared.messages import (
    AbortRequest,
    GenerateRequest,
    ReplayReply,
    ReplayRequest,
    TokenChunk,
)
from shared.node import spans
from shared.node.catalogue import CatalogueSync
from shared.node.chunks import error_chunk
from shared.node.direct import DirectReader, direct_reader
from shared.node.engine_host import EngineHost, engine_thread
from shared.node.keeps import NodeKeeps
from shared.node.ledger import Ledger
from shared.node.metrics import NodeMetrics
from shared.node.pins import BlockServer
from shared.node.puller import BlockPuller
from shared.node.settings import NodeSettings
from shared.node.sink import SinkServer
from shared.node.status import fill_status
from shared.node.upkeep import Upkeep
from shared.ops_http import OpsServer
from shared.sampling_params import SamplingParams
from shared.secrets import secret_fingerprint
from shared.stream_auth import abort_is_authentic, seal_chunk
from shared.transfer.base import TransferServer, create_server

log = logging.getLogger(__name__)


class NodeRole(Protocol):
    """What a prefill or decode service adds to the runtime."""

    async def on_outputs(self, outputs: list[RequestOutput]) -> None: ...

    async def on_abort(self, request_id: str) -> None:
        """Drops what the role keeps of the request (queued work); the runtime does the rest."""
        ...

    async def drain(self, deadline: float) -> None:
        """Finishes or hands over what the node holds, by ``deadline`` (monotonic)."""
        ...

    def describe(self, status: NodeStatus) -> None: ...


class NodeRuntime:
    """Owns one prefill or decode node's engine host, bus connection, ledger, block server,
    puller, heartbeat, catalogue session and ops server, and the tasks it runs for them.

    Invariants: every request the node accepted ends in the ledger as done, by finishing,
    failing with an error chunk, being aborted, or being handed over; its leases end with
    it. After ``stop`` nothing of it runs.
    """

    def __init__(
        self,
        settings: NodeSettings,
        role: str,
        *,
        engine: LLMEngine | None = None,
        bus: Bus | None = None,
    ) -> None:
        self.settings = settings
        self.role_name = role
        self.node_id = settings.resolved_node_id(role)
        self.host_id = subjects.host_id(settings.host_id)
        self.epoch = uuid.uuid4().hex[:16]
        self.fingerprint = secret_fingerprint(settings.cache_secret)
        self.checksum = BlockChecksum(settings.cache_secret)
        self.draining = False
        self._engine = engine
        self._bus = bus
        self.tasks: list[asyncio.Task[None]] = []
        self.metrics = NodeMetrics(self.node_id, role)
        self.ledger = Ledger(settings.lease_ttl_s)
        self.metrics.outcomes = self.ledger.outcomes
        self.ops: OpsServer | None = None
        self.catalogue: CatalogueSync | None = None
        self.role: NodeRole | None = None
        self.direct: DirectReader | None = None
        self.server: TransferServer = create_server(
            settings.transfer, self._provide, settings.transfer_host
        )

    async def start(self, make_role: Callable[[NodeRuntime], NodeRole]) -> None:
        s = self.settings
        await self.server.start()
        thread = engine_thread()
        if self._engine is None:
            loader = thread if s.engine_thread_load else None  # None: asyncio's default
            loop = asyncio.get_running_loop()
            self._engine = (await loop.run_in_executor(loader, load_engine, s)).engine
            # Its speed measured before any work, so its first heartbeat carries it.
            probe = probe_tokens(self._engine, s.startup_probe_tokens)
            await loop.run_in_executor(loader, probe_speed, self._engine, probe)
        self.engine: LLMEngine = self._engine
        # Before any block is offered, pinned or published: they carry checksums in this key.
        self.engine.checksum = self.checksum
        if self._bus is None:
            name = f"crescent-{self.node_id}"
            self._bus = await NatsBus.connect(s.nats_url, name, **s.connect_options())
        self.bus: Bus = self._bus
        cache = self.engine.runner.cache
        self.host = EngineHost(self.engine, self._on_outputs, s.step_timeout_s, thread)
        self.puller = BlockPuller(cache, self.checksum, s.pull_timeout_s)
        self.puller.metrics = self.metrics
        self.blocks = BlockServer(self.host, cache, self.ledger, s.transfer, self.server.address)
        self.direct = direct_reader(s, self.engine, cache)
        if self.direct is not None:
            self.direct.metrics = self.metrics
        self.sinks = SinkServer(
            self.host, self.ledger, s.transfer, self.server.address, cache.layout.block_bytes
        )
        self.role = make_role(self)
        self.host.start()
        await self._subscribe()
        self.upkeep = Upkeep(self)
        self.spawn(self.upkeep.run())
        self.spawn(heartbeat_loop(self.bus, s.heartbeat_interval_s, self.status, self._bare))
        if s.cachemeta_url:
            self._start_catalogue(s)
        if s.metrics_port is not None:
            registry = CollectorRegistry()
            registry.register(self.metrics)
            self.ops = OpsServer(s.metrics_host, s.metrics_port, self.healthy, registry)
            self.ops.start()

    async def _subscribe(self) -> None:
        bus, node = self.bus, self.node_id
        await bus.subscribe(subjects.ABORTS, AbortRequest, self._on_abort)
        await bus.subscribe(subjects.lease_releases(node), LeaseRelease, self._on_release)
        await bus.serve(subjects.peer_pins(node), PinRequest, self.blocks.on_pin)
        await bus.serve(subjects.replays(node), ReplayRequest, self._on_replay)
        await bus.serve(subjects.sinks(node), SinkRequest, self.sinks.on_sink)
        await bus.subscribe(subjects.sunk(node), SinkDone, self._on_sunk)

    def _start_catalogue(self, s: NodeSettings) -> None:
        # Imported here: a node without cachemeta never loads grpc.
        from shared.rpc.client import CacheMetaClient

        client = CacheMetaClient(s.cachemeta_url, token=s.cachemeta_token_value())
        self.catalogue = CatalogueSync(
            client,
            self.host,
            self.node_id,
            self.role_name,
            self.engine.runner.cache.layout.block_bytes,
            sync_interval_s=s.catalogue_sync_s,
            heartbeat_interval_s=s.heartbeat_interval_s,
        )
        self.spawn(self.catalogue.run())
        self.spawn(NodeKeeps(self.engine, client).run())  # keeps dropped or extended elsewhere

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(work))

    # -- state and output ---------------------------------------------------------------

    def healthy(self) -> bool:
        """For /healthz: the bus is up and the engine steps."""
        return self.bus.connected and self.engine_healthy()

    def engine_healthy(self) -> bool:
        """What heartbeats say: one that arrives proves the bus, and one made while the bus
        was down, sent once it is back, would call a working node unhealthy."""
        return not self.host.stuck()

    @property
    def takes_work(self) -> bool:
        return self.refusal() is None

    def refusal(self) -> str | None:
        """Why the node takes no new work now, or None."""
        if self.draining:
            return "draining"
        return "unhealthy" if self.host.stuck() else None

    def screen(
        self, request: GenerateRequest, waiting: int, queue: str
    ) -> TaskAck | SamplingParams:
        """The checks every task a node is offered passes first: the node takes work, the
        sampling is valid, the request is not already here, ``waiting`` is under the node's
        limit. Returns the answer when one settles the offer (an ack of a repeated one whose
        first ack was lost, or a refusal naming ``queue``), else the request's parameters."""
        refusal = self.refusal()
        if refusal is not None:
            return self.ack(False, refusal)
        try:
            params = request.sampling.to_params()
        except InvalidRequestError as exc:
            return self.ack(False, str(exc), 400)
        if self.ledger.active(request.request_id) is not None:
            return self.ack(True)
        if waiting >= self.settings.max_waiting:
            return self.ack(False, f"the {queue} is full")
        return params

    def ack(self, accepted: bool, reason: str = "", code: int | None = None) -> TaskAck:
        """The node's answer to a hand-off."""
        return TaskAck(
            accepted=accepted, node_id=self.node_id, epoch=self.epoch, reason=reason,
            error_code=code,
        )  # fmt: skip

    async def send(self, chunk: TokenChunk) -> None:
        """Publishes a chunk of one of this node's requests, signed with who made it."""
        chunk.node_id = self.node_id
        chunk.epoch = self.epoch
        holding = self.ledger.get(chunk.request_id)
        if tracing.enabled():
            spans.trace_chunk(chunk, holding)
        seal_chunk(chunk, holding.stream_key if holding is not None else b"")
        await self.bus.publish(subjects.tokens(chunk.request_id), chunk)

    async def fail(self, request_id: str, message: str, code: int) -> None:
        """Ends a request with an error its client will see."""
        holding = self.ledger.finish(request_id, time.monotonic(), error=message, error_code=code)
        index = holding.next_index if holding is not None else 0
        await self.send(error_chunk(request_id, message, code, index))

    async def abort(self, request_id: str, reason: str = "abort") -> None:
        """Stops a request here: role state, engine, leases, ledger (ended for ``reason``)."""
        if self.role is not None:
            await self.role.on_abort(request_id)
        await self.host.abort(request_id)
        for lease in self.ledger.release_all(request_id):
            await self.blocks.end(lease)
        self.ledger.finish(request_id, time.monotonic(), reason=reason)

    async def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        if self.role is not None:
            await self.role.on_outputs(outputs)

    async def _on_abort(self, abort: AbortRequest) -> None:
        if abort.only_node and abort.only_node != self.node_id:
            return
        holding = self.ledger.get(abort.request_id)
        if holding is None:
            return
        if not abort_is_authentic(abort, holding.stream_key):
            log.warning("ignored an abort of %s that its stream key did not sign", abort.request_id)
            return
        await self.abort(abort.request_id)

    async def _on_release(self, release: LeaseRelease) -> None:
        lease = await self.blocks.release(release.lease_id)
        if lease is not None and lease.request_id:
            # The decode node has the KV: this node's part of the request is over.
            self.ledger.finish(lease.request_id, time.monotonic(), reason="handed_over")

    async def _on_sunk(self, done: SinkDone) -> None:
        # The release normally came right after the copy; this one covers its loss.
        await self.blocks.release(done.lease_id)
        await self.sinks.on_sunk(done)

    async def _on_replay(self, request: ReplayRequest) -> ReplayReply:
        return self.ledger.replay(request.request_id, request.from_index)

    def _provide(self, lease_id: str, block_ids: Any) -> Any:
        return self.blocks.provide(lease_id, block_ids)

    # -- heartbeats ---------------------------------------------------------------------

    async def status(self) -> NodeStatus:
        snap = await self.host.load_snapshot()
        status = self._bare()
        fill_status(status, snap, self.engine, self.puller, self.server, self.direct)
        self.metrics.waiting_seqs = snap.load.waiting_seqs
        self.metrics.cached_blocks = snap.cached_blocks
        self.metrics.pool_evictions = snap.pool_evictions
        if self.role is not None:
            self.role.describe(status)
        self.metrics.update(status, snap.stats)
        return status

    def _bare(self) -> NodeStatus:
        """What a heartbeat says without asking the engine."""
        return NodeStatus(
            node_id=self.node_id,
            role=self.role_name,
            epoch=self.epoch,
            healthy=self.engine_healthy(),
            draining=self.draining,
            transfer_kind=self.settings.transfer,
            transfer_address=self.server.address,
            block_size=self.engine.config.block_size,
            pid=os.getpid(),
            secret_fingerprint=self.fingerprint,
            host_id=self.host_id,
        )

    async def beat_now(self) -> None:
        """An extra heartbeat, so peers learn of a change (draining) without waiting."""
        try:
            status = await asyncio.wait_for(self.status(), 1.0)
        except TimeoutError:
            status = self._bare()
        status.ts = time.time()
        await self.bus.publish(subjects.heartbeats(self.role_name, self.node_id), status)

    # -- stopping -----------------------------------------------------------------------

    async def drain(self) -> None:
        """Takes no new work, then lets the role finish or hand over what it holds."""
        self.draining = True
        with contextlib.suppress(Exception):
            await self.beat_now()
        if self.catalogue is not None:
            # Peers that take over our requests find our blocks through the catalogue.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.catalogue.sync_once(), 2.0)
        if self.role is not None:
            deadline = time.monotonic() + self.settings.drain_timeout_s
            try:
                await self.role.drain(deadline)
            except Exception:
                log.exception("draining failed")

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.bus.close()
        await self.host.stop()
        if self.catalogue is not None:
            await self._leave_catalogue(self.catalogue)
        await self.puller.close()
        await self.server.close()
        if self.ops is not None:
            self.ops.stop()

    async def _leave_catalogue(self, catalogue: CatalogueSync) -> None:
        """A clean stop withdraws the node's blocks at once instead of after the grace."""
        try:
            await asyncio.wait_for(catalogue.drop_all(), 2.0)
        except Exception as exc:
            log.warning("could not withdraw blocks from cachemeta: %s", exc)
        await catalogue.client.close()
