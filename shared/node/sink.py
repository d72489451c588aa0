"""Offering a node's cold blocks to the tierd of its host, so they outlive the pool.

tierd asks (a ``SinkRequest``); the node pins its coldest cached blocks that no lower tier
holds yet and answers with where to pull them (a ``SinkOffer``). tierd pulls them, releases
the pin at once (``LeaseRelease``: the pool waits only for a memory copy, never for a disk),
writes and registers them, and then says which ones are safe below (``SinkDone``). From then
on evicting them here loses nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shared.cluster_messages import SinkBlock, SinkDone, SinkOffer, SinkRequest
from shared.kv.hashing import BlockHash
from shared.node.engine_host import EngineHost
from shared.node.leases import LeaseKind, LeaseTable

#: A block offered but never reported sunk (tierd failed or restarted) is offered again
#: after this long.
OFFER_RETRY_S = 30.0


@dataclass(slots=True)
class SinkState:
    """What this node has offered and to which tierd incarnation: hash -> when offered."""

    tierd_epoch: str = ""
    offered: dict[BlockHash, float] = field(default_factory=dict)


class SinkServer:
    """Owns the node's side of write-down: the blocks offered and not yet reported sunk.

    Invariant: a block is offered again only when its last offer is older than
    ``OFFER_RETRY_S`` or tierd restarted; a block is marked sunk only on tierd's word, and
    every mark is dropped when tierd's epoch changes (what it held may be gone).
    """

    def __init__(
        self,
        engine: EngineHost,
        leases: LeaseTable,
        transfer_kind: str,
        transfer_address: bytes,
        block_bytes: int,
    ) -> None:
        self.engine = engine
        self.leases = leases
        self.transfer_kind = transfer_kind
        self.transfer_address = transfer_address
        self.block_bytes = block_bytes
        self.state = SinkState()
        self.blocks_offered = 0
        self.blocks_sunk = 0

    async def on_sink(self, request: SinkRequest) -> SinkOffer:
        now = time.monotonic()
        if request.epoch != self.state.tierd_epoch:
            self.state = SinkState(request.epoch)
            await self.engine.forget_sunk()
        self._forget_stale(now)
        skip = frozenset(self.state.offered)
        offered = await self.engine.offer_sink(request.max_blocks, skip.__contains__)
        if not offered:
            return self._offer("", [])
        lease = self.leases.grant(LeaseKind.SINK_OFFER, now, [b.block_id for b in offered])
        for block in offered:
            self.state.offered[block.block_hash] = now
        self.blocks_offered += len(offered)
        blocks = [
            SinkBlock(
                block_id=b.block_id,
                block_hash=b.block_hash,
                parent_hash=b.parent_hash,
                token_ids=list(b.token_ids),
                checksum=b.checksum,
                quota_key=b.quota_key,
            )
            for b in offered
        ]
        return self._offer(lease.token, blocks)

    async def on_sunk(self, done: SinkDone) -> None:
        for block_hash in done.sunk:
            self.state.offered.pop(block_hash, None)
        self.blocks_sunk += await self.engine.mark_sunk(list(done.sunk))

    def _forget_stale(self, now: float) -> None:
        offered = self.state.offered
        for block_hash in [h for h, at in offered.items() if now - at > OFFER_RETRY_S]:
            del offered[block_hash]

    def _offer(self, lease_id: str, blocks: list[SinkBlock]) -> SinkOffer:
        engine = self.engine
        return SinkOffer(
            lease_id=lease_id,
            blocks=blocks,
            transfer_kind=self.transfer_kind,
            transfer_address=self.transfer_address,
            model_id=engine.model_id,
            kv_dtype=engine.config.kv_dtype,
            block_size=engine.config.block_size,
            block_bytes=self.block_bytes,
        )
