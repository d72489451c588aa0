"""Serving a node's blocks to the nodes that pull them: pins of cached blocks for peers, the
leased KV of a finished prefill, and the transfer server's lookups of both.

Prefill nodes serve the prompt blocks they computed; decode nodes serve what they hold too,
generated tokens included, so a chat's next turn, or a request moved off a draining decode
node, can pull that history instead of recomputing it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from shared.cluster_messages import PinReply, PinRequest
from shared.kv.hashing import HASH_BYTES
from shared.model.kv_cache import PagedKVCache
from shared.node.engine_host import EngineHost
from shared.node.leases import Lease, LeaseKind, LeaseTable

log = logging.getLogger(__name__)


class BlockServer:
    """Owns the pins this node granted and the answers to pulls (both kept as leases in the
    node's ``LeaseTable``).

    Invariant: a lease is ended exactly once, by ``end`` after the table handed it out
    (released, aborted or expired); until then its blocks cannot be evicted, and a pull can
    read exactly the blocks it names, with its token.
    """

    MAX_PIN_BLOCKS = 8192

    def __init__(
        self,
        engine: EngineHost,
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
        pinned = await self.engine.pin(hashes) if hashes else []
        if not pinned:
            return self._reply("", [])
        block_ids = [b for b, _ in pinned]
        lease = self.leases.grant(LeaseKind.PEER_PIN, time.monotonic(), block_ids)
        self.pins_served += 1
        return self._reply(lease.token, pinned)

    def _reply(self, token: str, pinned: list[tuple[int, int]]) -> PinReply:
        return PinReply(
            lease_id=token,
            block_ids=[b for b, _ in pinned],
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
        """Lets the blocks of a lease the table handed out go: unpins a pin, returns a held
        prefill's blocks to the pool (they stay in the prefix cache either way)."""
        if lease.pinned:
            await self.engine.unpin(lease.block_ids)
        else:
            await self.engine.release_held(lease.request_id)

    async def release(self, token: str) -> Lease | None:
        """The puller has pulled (or given up); returns the lease that ended, if any."""
        lease = self.leases.release(token)
        if lease is not None:
            await self.end(lease)
        return lease

    async def expire(self) -> None:
        for lease in self.leases.expire(time.monotonic()):
            log.warning("lease on %d blocks expired before its pull", len(lease.block_ids))
            await self.end(lease)
