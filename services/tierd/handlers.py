"""Bus adapter of tierd: pins of lower-tier blocks for the nodes that pull them, their
releases, prefetches from the scheduler, reports of damaged files, and tierd's heartbeat."""

from __future__ import annotations

import logging
import os

from services.tierd.holdings import NVME, S3
from services.tierd.reads import TierReader
from services.tierd.staging import Staging
from services.tierd.tiering import Tiering
from shared.background import Background
from shared.cluster_messages import (
    CorruptBlocks,
    LeaseRelease,
    NodeStatus,
    PinReply,
    PinRequest,
    PrefetchRequest,
)
from shared.kv.hashing import HASH_BYTES

log = logging.getLogger(__name__)
#: How often upkeep runs: staged blocks nobody pulled free their memory within this long.
UPKEEP_S = 1.0
#: Prefetches run at most this many at once; more are dropped (they are only hints).
MAX_PREFETCHES = 4


class TierdHandlers:
    """Owns the prefetches in flight; the blocks belong to ``Tiering``, the staged reads to
    ``Staging``.

    Invariant: a pin's reply names only blocks staged under its lease, each with the checksum
    its stored header carries (which the read just verified).
    """

    def __init__(
        self,
        node_id: str,
        host_id: str,
        epoch: str,
        tiering: Tiering,
        reader: TierReader,
        staging: Staging,
        transfer_kind: str,
        transfer_address: bytes,
    ) -> None:
        self.node_id = node_id
        self.host_id = host_id
        self.epoch = epoch
        self.tiering = tiering
        self.reader = reader
        self.staging = staging
        self.transfer_kind = transfer_kind
        self.transfer_address = transfer_address
        self.pins_served = 0
        self._prefetching = 0
        self._work = Background()

    async def on_pin(self, request: PinRequest) -> PinReply:
        hashes = [h for h in request.block_hashes if len(h) == HASH_BYTES]
        if len(hashes) < len(request.block_hashes):
            hashes = []  # a malformed chain pins nothing
        held = self.tiering.holdings.blocks.get(hashes[0]) if hashes else None
        block_bytes = held.header.num_bytes if held is not None else 1
        hashes = hashes[: self.staging.room() // max(block_bytes, 1)]
        read = await self.reader.read(hashes) if hashes else []
        # Concurrent pins may have taken the room meanwhile: only what is staged is named.
        staged = self.staging.stage([block for block, _ in read])
        if not staged.headers:
            return PinReply(
                lease_id="",
                block_ids=[],
                block_checksums=[],
                transfer_kind=self.transfer_kind,
                transfer_address=self.transfer_address,
            )
        self.pins_served += 1
        count = len(staged.headers)
        return PinReply(
            lease_id=staged.token,
            block_ids=list(range(count)),
            block_checksums=[h.checksum for h in staged.headers],
            transfer_kind=self.transfer_kind,
            transfer_address=self.transfer_address,
            block_tiers=[tier for _, tier in read[:count]],
        )

    async def on_release(self, release: LeaseRelease) -> None:
        self.staging.release(release.lease_id)

    async def on_prefetch(self, request: PrefetchRequest) -> None:
        if self._prefetching >= MAX_PREFETCHES:
            return
        hashes = [h for h in request.block_hashes if len(h) == HASH_BYTES]
        self._prefetching += 1
        self._work.spawn(self._prefetch(hashes))

    async def _prefetch(self, hashes: list[bytes]) -> None:
        try:
            count = await self.reader.prefetch(hashes)
            if count:
                log.info("prefetched %d blocks from S3 to NVMe", count)
        finally:
            self._prefetching -= 1

    async def on_corrupt(self, report: CorruptBlocks) -> None:
        bad = await self.reader.check_reported(list(report.block_hashes), report.tier)
        if bad:
            log.warning("a node found %d damaged %s blocks; dropped", bad, report.tier)

    async def status(self) -> NodeStatus:
        return self.status_now()

    def status_now(self) -> NodeStatus:
        t = self.tiering
        tiers = {NVME: (t.nvme.capacity_bytes, t.nvme.used_bytes)}
        if t.s3 is not None:
            tiers[S3] = (t.limits.s3_capacity_bytes, t.s3.used_bytes)
        return NodeStatus(
            node_id=self.node_id,
            role="tierd",
            epoch=self.epoch,
            healthy=True,
            host_id=self.host_id,
            transfer_kind=self.transfer_kind,
            transfer_address=self.transfer_address,
            tiers=tiers,
            read_bandwidth=dict(self.reader.bandwidth.by_tier),
            pid=os.getpid(),
        )

    async def upkeep(self) -> None:
        """One round of the tiers' lifecycle and the expiry of read-up blocks nobody pulled."""
        self.staging.expire()
        await self.tiering.maintain()

    async def close(self) -> None:
        await self._work.close()
