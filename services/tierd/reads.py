"""Reading blocks back up: for a node's pull, for a prefetch from S3 to NVMe, and to check a
node's report of a damaged file. Every read verifies the block's header and checksum; a copy
that fails is dropped (file or object and row), counted, and the next tier is tried, so a bad
copy costs a recompute at worst, never a wrong token.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from services.tierd.holdings import NVME, S3
from services.tierd.s3 import S3Unavailable
from services.tierd.tiering import Tiering
from shared.kv.block_file import BlockFormatError, BlockHeader

log = logging.getLogger(__name__)
Block = tuple[BlockHeader, bytearray]


@dataclass(slots=True)
class ReadBandwidth:
    """Bytes/s of reads per tier, an exponentially weighted mean over read batches."""

    weight: float = 0.3
    by_tier: dict[str, float] = field(default_factory=dict)

    def record(self, tier: str, num_bytes: int, seconds: float) -> None:
        if num_bytes <= 0 or seconds <= 0:
            return
        rate, old = num_bytes / seconds, self.by_tier.get(tier)
        self.by_tier[tier] = rate if old is None else old + self.weight * (rate - old)


class TierReader:
    """Owns the read bandwidth measured per tier; everything else belongs to ``Tiering``.

    Invariant: ``read`` returns only verified blocks, and only the leading run of the chain
    asked for (a prefix is usable only up to its first gap).
    """

    def __init__(self, tiering: Tiering) -> None:
        self.tiering = tiering
        self.bandwidth = ReadBandwidth()
        self.blocks_read: dict[str, int] = {NVME: 0, S3: 0}

    async def read(self, block_hashes: list[bytes]) -> list[tuple[Block, str]]:
        """The leading blocks of the chain that some tier holds intact, each read from the
        fastest tier holding it (NVMe files one after another, S3 objects concurrently), with
        the tier it came from."""
        holdings = self.tiering.holdings
        chain: list[bytes] = []
        for block_hash in block_hashes:
            if block_hash not in holdings:
                break
            chain.append(block_hash)
        nvme = [h for h in chain if NVME in holdings.tiers_of(h)]
        on_nvme = set(nvme)
        s3 = [h for h in chain if h not in on_nvme]
        found: dict[bytes, tuple[Block, str]] = {}
        await asyncio.gather(self._batch(nvme, NVME, found), self._batch(s3, S3, found))
        blocks: list[tuple[Block, str]] = []
        for block_hash in chain:
            block = found.get(block_hash)
            if block is None:
                break
            blocks.append(block)
        holdings.touch([b[0][0].block_hash for b in blocks], self.tiering.clock())
        return blocks

    async def _batch(
        self, block_hashes: list[bytes], tier: str, into: dict[bytes, tuple[Block, str]]
    ) -> None:
        if not block_hashes:
            return
        started = time.perf_counter()
        if tier == NVME:
            got = [await self._read_tiered(h, NVME) for h in block_hashes]
        else:
            got = await asyncio.gather(*(self._read_tiered(h, S3) for h in block_hashes))
        num_bytes = 0
        for block_hash, block in zip(block_hashes, got, strict=True):
            if block is not None:
                into[block_hash] = block
                num_bytes += len(block[0][1])
        self.bandwidth.record(tier, num_bytes, time.perf_counter() - started)

    async def read_one(self, block_hash: bytes, first_tier: str) -> Block | None:
        """The block from ``first_tier``, else from the other tier holding it."""
        got = await self._read_tiered(block_hash, first_tier)
        return None if got is None else got[0]

    async def _read_tiered(self, block_hash: bytes, first_tier: str) -> tuple[Block, str] | None:
        for tier in (first_tier, S3 if first_tier == NVME else NVME):
            if tier not in self.tiering.holdings.tiers_of(block_hash):
                continue
            block = await self._get(block_hash, tier)
            if block is not None:
                self.blocks_read[tier] += 1
                return block, tier
        return None

    async def _get(self, block_hash: bytes, tier: str) -> Block | None:
        t = self.tiering
        store = t.nvme if tier == NVME else t.s3
        if store is None or (tier == S3 and not t.s3_usable):
            return None
        try:
            return await store.get(block_hash)
        except KeyError:
            log.warning("%s block %s vanished; unlisting it", tier, block_hash.hex())
        except BlockFormatError as exc:
            t.counters.corrupt[tier] += 1
            log.warning("%s block %s is damaged (%s); dropped", tier, block_hash.hex(), exc)
        except S3Unavailable as exc:
            t.s3_failed(exc)
            return None
        # The store deleted the bad copy already; the row and the holding follow.
        t.holdings.remove(block_hash, tier)
        await t.catalogue.drop(tier, [block_hash])
        return None

    async def check_reported(self, block_hashes: list[bytes], tier: str) -> int:
        """Reads each reported block again itself; only a copy that fails here is dropped.
        Returns how many were bad."""
        bad = 0
        for block_hash in block_hashes:
            if tier in self.tiering.holdings.tiers_of(block_hash):
                before = self.tiering.counters.corrupt[tier]
                await self._get(block_hash, tier)
                bad += self.tiering.counters.corrupt[tier] - before
        return bad

    async def prefetch(self, block_hashes: list[bytes]) -> int:
        """Copies the chain's leading S3-only blocks up to NVMe, so a coming pull reads files,
        not objects; returns how many came up. The S3 copies stay."""
        t = self.tiering
        if t.s3 is None:
            return 0
        wanted = []
        for block_hash in block_hashes:
            tiers = t.holdings.tiers_of(block_hash)
            if not tiers:
                break
            if tiers == {S3}:
                wanted.append(block_hash)
        t.holdings.touch(wanted, t.clock())  # hot now: not the victims of their own room
        got = await asyncio.gather(*(self.read_one(h, S3) for h in wanted))
        return await t.copy_up([b for b in got if b is not None])
