"""Serving a node's cached blocks to peers: pin on request, hand the buffers to the transfer
server, unpin when the peer releases the pin or its lease expires.

Prefill nodes serve the prompt blocks they computed; decode nodes serve what they hold too,
generated tokens included, so the next turn of a chat can pull its history instead of
recomputing it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

import numpy as np

from shared.cluster_messages import PinReply, PinRequest
from shared.engine.async_engine import AsyncEngine
from shared.kv.hashing import HASH_BYTES
from shared.model.kv_cache import PagedKVCache
from shared.node.leases import Lease, LeaseTable

log = logging.getLogger(__name__)


class PinServer:
    """Owns the pins this node granted to peers (as ``pinned`` leases in ``leases``, a table it
    may share with other leases of the node) and their counters.

    Invariant: a pinned lease is unpinned exactly once, by ``end`` after ``LeaseTable.pop`` or
    ``LeaseTable.expire`` returned it; while it lives its blocks cannot be evicted.
    """

    MAX_PIN_BLOCKS = 8192

    def __init__(
        self,
        engine: AsyncEngine,
        cache: PagedKVCache,
        leases: LeaseTable,
        transfer_kind: str,
        transfer_address: bytes,
    ) -> None:
        self.engine = engine
        self.cache = cache
        self.leases = leases
        self.transfer_kind = transfer_kind
        self.transfer_address = transfer_address
        self.pins_served = 0

    async def on_pin(self, request: PinRequest) -> PinReply:
        """A peer asks to pull cached blocks: hold the leading ones still here under a lease."""
        hashes = request.block_hashes[: self.MAX_PIN_BLOCKS]
        if any(len(h) != HASH_BYTES for h in hashes):
            hashes = []
        pin_id = f"pin-{uuid.uuid4().hex}"
        exchange = self.engine.engine.exchange
        pinned = await self.engine.call_now(lambda: exchange.pin(pin_id, hashes)) if hashes else []
        block_ids = [b for b, _ in pinned]
        if block_ids:
            self.leases.grant(pin_id, pin_id, block_ids, time.monotonic(), pinned=True)
            self.pins_served += 1
        return PinReply(
            lease_id=pin_id if block_ids else "",
            block_ids=block_ids,
            block_checksums=[c for _, c in pinned],
            transfer_kind=self.transfer_kind,
            transfer_address=self.transfer_address,
        )

    def provide(self, lease_id: str, block_ids: Sequence[int]) -> list[np.ndarray] | None:
        """Transfer-server callback: buffers of leased blocks, straight from the pool."""
        allowed = self.leases.blocks_for(lease_id, list(block_ids), time.monotonic())
        if allowed is None:
            return None
        return [self.cache.block_buffer(b) for b in allowed]

    async def end(self, lease: Lease) -> None:
        """Unpins the blocks of a pinned lease that was popped or expired."""
        exchange = self.engine.engine.exchange
        await self.engine.call_now(lambda: exchange.unpin(lease.lease_id))

    async def release(self, lease_id: str) -> None:
        """The peer has pulled (or given up): the blocks may be evicted again."""
        lease = self.leases.pop(lease_id)
        if lease is not None and lease.pinned:
            await self.end(lease)

    async def expire(self) -> None:
        """Unpins the pins whose peer never released them; for a node whose table holds only
        pins (a prefill node expires its shared table itself)."""
        for lease in self.leases.expire(time.monotonic()):
            log.warning("pin %s expired before its peer released it", lease.lease_id)
            await self.end(lease)
