"""Taking the cold blocks of this host's pools down to NVMe.

Every round, each node of the host whose pool holds more blocks without a lower-tier copy
than the watermark allows is asked for its coldest ones (``SinkRequest``). tierd pulls them
over the node's transfer server, releases the node's pin at once, checks each block against
its checksum, writes and lists it (``Tiering.admit``), and tells the node which blocks are
safe below (``SinkDone``). None of it is on a request's path: a pool only ever waits for the
memory copy of a pull, never for a disk or for S3.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np

from services.tierd.tiering import Tiering
from shared import subjects
from shared.bus import Bus, BusRequestError
from shared.cluster_messages import (
    LeaseRelease,
    NodeStatus,
    SinkBlock,
    SinkDone,
    SinkOffer,
    SinkRequest,
)
from shared.kv.block_file import BlockHeader
from shared.kv.checksum import BlockChecksum
from shared.transfer.base import TransferClient, TransferError, create_client

log = logging.getLogger(__name__)
#: A node not heard from for this long is not asked.
NODE_SILENCE_S = 3.0
#: Rounds one node gets back to back while it still has blocks to offer.
MAX_ROUNDS = 8
SINK_ROLES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class SinkPolicy:
    watermark: float = 0.0  # share of a pool that may lack a lower-tier copy
    interval_s: float = 0.2
    batch: int = 32
    request_timeout_s: float = 2.0
    pull_timeout_s: float = 10.0


class Sinker:
    """Owns the view of this host's nodes (their last heartbeats) and the transfer clients
    that pull from them.

    Invariant: a node's pin ends (``LeaseRelease``) right after its pull, whatever the pull's
    fate; a block is reported sunk only once ``Tiering`` holds it.
    """

    def __init__(
        self,
        bus: Bus,
        tiering: Tiering,
        host_id: str,
        epoch: str,
        policy: SinkPolicy,
        checksum: BlockChecksum,
    ) -> None:
        self.bus = bus
        self.checksum = checksum
        self.tiering = tiering
        self.host_id = host_id
        self.epoch = epoch
        self.policy = policy
        self.nodes: dict[str, tuple[NodeStatus, float]] = {}
        self.clients: dict[str, TransferClient] = {}
        self.blocks_pulled = 0
        self.pulls_failed = 0

    async def on_heartbeat(self, subject: str, status: NodeStatus) -> None:
        # Only a node's own subject speaks for it (NATS permissions confine each to its own).
        if subject != subjects.heartbeats(status.role, status.node_id):
            return
        if status.role in SINK_ROLES and status.host_id == self.host_id:
            self.nodes[status.node_id] = (status, time.monotonic())

    def due(self) -> list[str]:
        """Local nodes heard lately whose unsunk blocks exceed the watermark."""
        now = time.monotonic()
        for node_id in [n for n, (_, at) in self.nodes.items() if now - at > NODE_SILENCE_S]:
            del self.nodes[node_id]
        return [
            node_id
            for node_id, (s, _) in self.nodes.items()
            if s.unsunk_blocks > self.policy.watermark * max(s.total_blocks, 1)
        ]

    async def sink_round(self) -> None:
        """Sinks from every node due, one after another."""
        for node_id in self.due():
            await self.sink_node(node_id)

    async def sink_node(self, node_id: str) -> int:
        """Rounds with one node until it offers nothing (or ``MAX_ROUNDS``); blocks sunk."""
        total = 0
        for _ in range(MAX_ROUNDS):
            ask = SinkRequest(max_blocks=self.policy.batch, epoch=self.epoch)
            try:
                offer = await self.bus.request(
                    subjects.sinks(node_id), ask, SinkOffer, self.policy.request_timeout_s
                )
            except BusRequestError as exc:
                log.debug("node %s did not answer a sink request: %s", node_id, exc)
                return total
            if not offer.blocks:
                return total
            sunk = await self._take(node_id, offer)
            total += len(sunk)
            if not sunk:
                return total  # tierd cannot keep them now (no room, S3 down): try later
        return total

    async def _take(self, node_id: str, offer: SinkOffer) -> list[bytes]:
        holdings = self.tiering.holdings
        known = [b.block_hash for b in offer.blocks if b.block_hash in holdings]
        wanted = [b for b in offer.blocks if b.block_hash not in holdings]
        try:
            payloads = await self._pull(node_id, offer, wanted)
        finally:
            release = LeaseRelease(lease_id=offer.lease_id)
            await self.bus.publish(subjects.lease_releases(node_id), release)
        holdings.touch(known, self.tiering.clock())
        fresh = [(_header(offer, b), p) for b, p in payloads]
        sunk = known + await self.tiering.admit(fresh)
        done = SinkDone(lease_id=offer.lease_id, sunk=sunk)
        await self.bus.publish(subjects.sunk(node_id), done)
        return sunk

    async def _pull(
        self, node_id: str, offer: SinkOffer, wanted: list[SinkBlock]
    ) -> list[tuple[SinkBlock, memoryview]]:
        """The wanted blocks that arrived intact, with their bytes."""
        if not wanted or offer.block_bytes <= 0:
            return []
        dest = [np.empty(offer.block_bytes, dtype=np.uint8) for _ in wanted]
        try:
            client = self._client(offer.transfer_kind)
            await client.pull(
                offer.transfer_address, offer.lease_id, [b.block_id for b in wanted], dest
            )
        except TransferError as exc:
            self.pulls_failed += 1
            log.warning("pulling blocks to sink from %s failed: %s", node_id, exc)
            return []
        sums = await asyncio.to_thread(lambda: [self.checksum(d.data) for d in dest])
        intact: list[tuple[SinkBlock, memoryview]] = []
        for block, got, buffer in zip(wanted, sums, dest, strict=True):
            if got == block.checksum:
                intact.append((block, buffer.data))
            else:
                log.warning("block to sink from %s is corrupt; skipped", node_id)
        self.blocks_pulled += len(intact)
        return intact

    def _client(self, kind: str) -> TransferClient:
        client = self.clients.get(kind)
        if client is None:
            client = self.clients[kind] = create_client(kind, timeout_s=self.policy.pull_timeout_s)
        return client

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


def _header(offer: SinkOffer, block: SinkBlock) -> BlockHeader:
    return BlockHeader(
        block_hash=block.block_hash,
        parent_hash=block.parent_hash,
        token_ids=tuple(block.token_ids),
        checksum=block.checksum,
        num_bytes=offer.block_bytes,
        model_id=offer.model_id,
        block_size=offer.block_size,
        kv_dtype=offer.kv_dtype,
        quota_key=block.quota_key,
        created_at=time.time(),
    )
