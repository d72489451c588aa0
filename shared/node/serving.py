"""A node's side of its requests' streams: screening offered work, signing and publishing
chunks, ending requests (finished, failed, aborted) and their leases, and the bus messages
that do so from outside (aborts, lease releases, replays)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from shared import subjects, tracing
from shared.bus import Bus
from shared.cluster_messages import LeaseRelease, SinkDone, TaskAck
from shared.engine.types import RequestOutput
from shared.errors import InvalidRequestError
from shared.messages import AbortRequest, GenerateRequest, ReplayReply, ReplayRequest, TokenChunk
from shared.node import spans
from shared.node.chunks import error_chunk
from shared.node.context import NodeRole
from shared.node.engine_host import EngineHost
from shared.node.leases import Lease, LeaseTable
from shared.node.metrics import NodeMetrics
from shared.node.pins import BlockServer
from shared.node.puller import BlockPuller
from shared.node.requests import RequestTable
from shared.node.settings import NodeSettings
from shared.node.sink import SinkServer
from shared.sampling_params import SamplingParams
from shared.stream_auth import abort_is_authentic, seal_chunk

log = logging.getLogger(__name__)


@dataclass(slots=True)
class NodeServing:
    """Owns nothing but the node's ``draining`` flag and its ``role``; every request it ends
    ends in ``requests`` with its leases let go. Implements ``NodeContext``."""

    settings: NodeSettings
    node_id: str
    epoch: str
    requests: RequestTable
    leases: LeaseTable
    host: EngineHost
    bus: Bus
    metrics: NodeMetrics
    puller: BlockPuller
    blocks: BlockServer
    sinks: SinkServer
    transfer_address: bytes
    beat: Callable[[], Awaitable[None]]
    role: NodeRole | None = None
    draining: bool = field(default=False)

    @property
    def block_size(self) -> int:
        return self.host.config.block_size

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
        if self.requests.active(request.request_id) is not None:
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
        request = self.requests.get(chunk.request_id)
        if tracing.enabled():
            spans.trace_chunk(chunk, request)
        seal_chunk(chunk, request.stream_key if request is not None else b"")
        await self.bus.publish(subjects.tokens(chunk.request_id), chunk)

    async def fail(self, request_id: str, message: str, code: int) -> None:
        """Ends a request with an error its client will see, and lets its leases go."""
        request = self.requests.failed(request_id, time.monotonic(), message, code)
        await self._end_leases(request_id)
        index = request.next_index if request is not None else 0
        await self.send(error_chunk(request_id, message, code, index))

    async def abort(self, request_id: str, reason: str = "abort") -> None:
        """Stops a request here: role state, engine, leases, table (ended for ``reason``)."""
        if self.role is not None:
            await self.role.on_abort(request_id)
        await self.host.abort(request_id)
        await self._end_leases(request_id)
        self.requests.finished(request_id, time.monotonic(), reason)

    async def end_lease(self, lease: Lease) -> None:
        """Lets a lease's blocks go, once: only a lease still in the table is ended."""
        if self.leases.release(lease.token) is not None:
            await self.blocks.end(lease)

    async def beat_now(self) -> None:
        await self.beat()

    async def _end_leases(self, request_id: str) -> None:
        for lease in self.leases.release_all(request_id):
            await self.blocks.end(lease)

    # -- bus messages -------------------------------------------------------------------

    async def on_outputs(self, outputs: list[RequestOutput]) -> None:
        if self.role is not None:
            await self.role.on_outputs(outputs)

    async def on_abort(self, abort: AbortRequest) -> None:
        if abort.only_node and abort.only_node != self.node_id:
            return
        request = self.requests.get(abort.request_id)
        if request is None or not request.active:
            return
        if not abort_is_authentic(abort, request.stream_key):
            log.warning("ignored an abort of %s that its stream key did not sign", abort.request_id)
            return
        await self.abort(abort.request_id)

    async def on_release(self, release: LeaseRelease) -> None:
        lease = await self.blocks.release(release.lease_id)
        if lease is not None and lease.request_id:
            # The decode node has the KV: this node's part of the request is over.
            self.requests.finished(lease.request_id, time.monotonic(), "handed_over")

    async def on_sunk(self, done: SinkDone) -> None:
        # The release normally came right after the copy; this one covers its loss.
        await self.blocks.release(done.lease_id)
        await self.sinks.on_sunk(done)

    async def on_replay(self, request: ReplayRequest) -> ReplayReply:
        return self.requests.replay(request.request_id, request.from_index)
