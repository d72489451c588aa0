"""Where each block below DRAM lives, and every move between tiers: admission from a pool,
NVMe to S3, deletion (capacity, quota, TTL), and the reconciliation at start.

Order of every move (the catalogue invariant): the new copy is written and listed in cachemeta
before the old copy is unlisted and deleted, so a block is never listed where it is not, and a
block is never dropped from everywhere while a row still points at it. A crash between two
steps leaves an extra copy or an extra row; the next resync (``TierCatalogue``) repairs both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from services.tierd.catalogue import CatalogueDown, TierCatalogue
from services.tierd.holdings import NVME, S3, Holdings
from services.tierd.limits import Limits, TierCounters
from services.tierd.nvme import NvmeStore
from services.tierd.s3 import S3Store, S3Unavailable
from services.tierd.store_index import StoreFull
from shared.kv.block_file import BlockFormatError, BlockHeader, packed_size

log = logging.getLogger(__name__)
#: After S3 failed, tierd leaves it alone this long before trying again.
S3_RETRY_S = 2.0
#: Blocks moved to S3 concurrently in one round.
MOVE_BATCH = 16
#: The deletion reason of an NVMe copy whose block went on to S3: a move, not an eviction.
MOVED = "moved"


class Tiering:
    """Owns the stores, the holdings and the moves between tiers.

    Invariants: ``holdings`` lists a block in a tier iff that tier's store holds it; every
    change of where blocks live runs under one lock, so moves never interleave (reads do not
    take it: a read that finds a copy gone falls back to the next tier).
    """

    def __init__(
        self,
        nvme: NvmeStore,
        s3: S3Store | None,
        holdings: Holdings,
        catalogue: TierCatalogue,
        limits: Limits,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvme = nvme
        self.s3 = s3
        self.holdings = holdings
        self.catalogue = catalogue
        self.limits = limits
        self.clock = clock
        self.counters = TierCounters()
        self.lock = asyncio.Lock()
        self.s3_ready = False  # scanned, so its index is the bucket's content
        self._s3_down_until = 0.0

    # -- state ----------------------------------------------------------------------------

    def contents(self, tier: str) -> list[BlockHeader]:
        """What a tier holds, as the catalogue should list it."""
        if tier == NVME:
            return list(self.nvme.headers().values())
        if self.s3 is None or not self.s3_ready:
            return []  # unknown yet: listed once the bucket is scanned
        return list(self.s3.headers().values())

    @property
    def s3_usable(self) -> bool:
        return self.s3 is not None and self.s3_ready and time.monotonic() >= self._s3_down_until

    def s3_failed(self, exc: Exception) -> None:
        if time.monotonic() >= self._s3_down_until:
            log.warning("S3 is unavailable (%s); NVMe keeps its blocks until it is back", exc)
        self._s3_down_until = time.monotonic() + S3_RETRY_S

    # -- start ----------------------------------------------------------------------------

    async def reconcile(self) -> None:
        """Indexes what the tiers hold (deleting damaged leftovers); the catalogue's next
        resync then lists exactly that."""
        found = await self.nvme.scan()
        for removed in found.removed:
            log.warning("NVMe: removed %s (%s)", removed.name, removed.reason)
        now = self.clock()
        for header in self.nvme.headers().values():
            self.holdings.add(header, NVME, header.created_at or now)
        await self.scan_s3()
        self.catalogue.in_step = False
        log.info(
            "tiers reconciled: %d blocks on NVMe, %d in S3",
            self.nvme.num_blocks,
            self.s3.num_blocks if self.s3 is not None else 0,
        )

    async def scan_s3(self) -> None:
        """Opens and indexes the bucket if that has not happened yet (S3 may be down)."""
        if self.s3 is None or self.s3_ready or time.monotonic() < self._s3_down_until:
            return
        try:
            await self.s3.start()
            found = await self.s3.scan()
        except S3Unavailable as exc:
            self.s3_failed(exc)
            return
        for removed in found.removed:
            log.warning("S3: removed %s (%s)", removed.name, removed.reason)
        now = self.clock()
        async with self.lock:
            for header in self.s3.headers().values():
                self.holdings.add(header, S3, header.created_at or now)
        self.s3_ready = True
        self.catalogue.in_step = False  # list what the bucket holds

    # -- admission from a pool ------------------------------------------------------------

    async def admit(self, blocks: Iterable[tuple[BlockHeader, memoryview]]) -> list[bytes]:
        """Writes pool blocks to NVMe and lists them; returns the hashes now held below DRAM
        (already held ones included). A block that does not fit (quota, or no room
        while S3 is down) is left to its pool."""
        kept: list[BlockHeader] = []
        sunk: list[bytes] = []
        async with self.lock:
            for header, payload in blocks:
                if header.block_hash in self.holdings:
                    self.holdings.touch([header.block_hash], self.clock())
                    sunk.append(header.block_hash)
                elif await self._write(header, payload):
                    kept.append(header)
            try:
                await self.catalogue.register(NVME, kept)
            except CatalogueDown as exc:
                # Safe on NVMe all the same; the resync this leaves pending lists them.
                log.warning("could not list %d new NVMe blocks (%s)", len(kept), exc)
        return sunk + [h.block_hash for h in kept]

    async def _write(self, header: BlockHeader, payload: memoryview) -> bool:
        size = packed_size(header, self.nvme.seal.encrypt)
        if not await self._fit_quota(header.quota_key, header.num_bytes):
            self.counters.refused += 1
            return False
        if not await self._room_on_nvme(size, header):
            self.counters.refused += 1
            return False
        try:
            await self.nvme.put(header, payload)
        except (StoreFull, BlockFormatError, OSError) as exc:
            log.warning("NVMe write of %s failed: %s", header.block_hash.hex(), exc)
            self.counters.refused += 1
            return False
        self.holdings.add(header, NVME, self.clock())
        self.counters.written[NVME] += 1
        return True

    async def _fit_quota(self, quota_key: bytes, num_bytes: int) -> bool:
        quota = self.limits.quota_for(quota_key)
        if quota <= 0:
            return True
        if num_bytes > quota:
            return False
        excess = self.holdings.over_quota(quota_key, num_bytes, quota)
        if excess > 0:
            victims = self.holdings.victims(excess, self.clock(), quota_key=quota_key)
            await self.delete(victims, "quota")
        return self.holdings.over_quota(quota_key, num_bytes, quota) == 0

    async def _room_on_nvme(self, size: int, incoming: BlockHeader | None = None) -> bool:
        """Frees NVMe for ``size`` more bytes: down to S3, or (without an S3 tier) deleted if
        the policy admits ``incoming`` over them; nothing leaves NVMe while a configured S3
        is down."""
        while self.nvme.free_bytes < size:
            need = size - self.nvme.free_bytes
            victims = self.holdings.victims(need, self.clock(), tier=NVME)
            if not victims:
                return False
            if self.s3 is None:
                if incoming is not None and not self.holdings.admits(
                    incoming, victims, self.clock()
                ):
                    return False
                await self.delete(victims, "capacity")
            elif not self.s3_usable or not await self.move_down(victims):
                return False
        return True

    async def copy_up(self, blocks: list[tuple[BlockHeader, bytearray]]) -> int:
        """Puts blocks read from S3 on NVMe as well (a prefetch) and lists them there."""
        kept = []
        async with self.lock:
            for header, payload in blocks:
                if NVME in self.holdings.tiers_of(header.block_hash):
                    continue
                if await self._room_on_nvme(packed_size(header, self.nvme.seal.encrypt)):
                    try:
                        await self.nvme.put(header, memoryview(payload))
                    except (StoreFull, OSError) as exc:
                        log.warning("prefetch of %s failed: %s", header.block_hash.hex(), exc)
                        continue
                    self.holdings.add(header, NVME, self.clock())
                    kept.append(header)
            try:
                await self.catalogue.register(NVME, kept)
            except CatalogueDown as exc:
                log.warning("could not list %d prefetched blocks (%s)", len(kept), exc)
        return len(kept)

    # -- NVMe to S3 -----------------------------------------------------------------------

    async def move_down(self, victims: list[bytes]) -> bool:
        """Moves blocks from NVMe to S3; False when none could move (S3 down, the catalogue
        unreachable)."""
        assert self.s3 is not None
        moved: list[bytes] = []
        for i in range(0, len(victims), MOVE_BATCH):
            batch = victims[i : i + MOVE_BATCH]
            uploaded = await asyncio.gather(*(self._upload(h) for h in batch))
            listed = [header for header in uploaded if header is not None]
            try:
                await self.catalogue.register(S3, listed)
            except CatalogueDown:
                break  # the uploads stay unlisted orphans until the resync lists them
            moved.extend(h for h in batch if S3 in self.holdings.tiers_of(h))
            if len(listed) < len(batch) and not self.s3_usable:
                break
        await self._drop_copies(moved, NVME, MOVED)
        return bool(moved)

    async def _upload(self, block_hash: bytes) -> BlockHeader | None:
        """Copies one NVMe block to S3; its header, or None if nothing was copied."""
        assert self.s3 is not None
        if S3 in self.holdings.tiers_of(block_hash):
            return None
        try:
            header, payload = await self.nvme.get(block_hash)
        except KeyError:
            self.holdings.remove(block_hash, NVME)
            return None
        except BlockFormatError:
            self.counters.corrupt[NVME] += 1
            self.holdings.remove(block_hash, NVME)
            await self.catalogue.drop(NVME, [block_hash])
            return None
        try:
            await self.s3.put(header, memoryview(payload))
        except S3Unavailable as exc:
            self.s3_failed(exc)
            return None
        self.holdings.add(header, S3, self.clock())
        self.counters.written[S3] += 1
        return header

    # -- deletion -------------------------------------------------------------------------

    async def delete(self, block_hashes: list[bytes], reason: str) -> int:
        """Deletes blocks from every tier, their rows first; returns how many went."""
        gone = 0
        for tier in (S3, NVME):
            in_tier = [h for h in block_hashes if tier in self.holdings.tiers_of(h)]
            gone += await self._drop_copies(in_tier, tier, reason)
        return gone

    async def _drop_copies(self, block_hashes: list[bytes], tier: str, reason: str) -> int:
        """Unlists and deletes the copies in ``tier``; returns how many blocks left tierd."""
        if not block_hashes:
            return 0
        await self.catalogue.drop(tier, block_hashes)  # a failure leaves a resync pending
        gone = deleted = 0
        for block_hash in block_hashes:
            try:
                await (self.nvme if tier == NVME else self._s3()).delete(block_hash)
            except S3Unavailable as exc:
                # The object stays, unlisted and still held here: it serves reads, and the
                # resync the failed row drop (or the next start) leaves pending lists it.
                self.s3_failed(exc)
                continue
            deleted += 1
            gone += self.holdings.remove(block_hash, tier)
        counters = self.counters
        counters.deleted[reason] = counters.deleted.get(reason, 0) + deleted
        if reason != MOVED:
            counters.evicted[tier, reason] = counters.evicted.get((tier, reason), 0) + deleted
        return gone

    def _s3(self) -> S3Store:
        assert self.s3 is not None
        return self.s3

    # -- upkeep ---------------------------------------------------------------------------

    async def maintain(self) -> None:
        """One round of upkeep: S3 back, the TTL, NVMe under its watermark, S3 capacity."""
        await self.scan_s3()
        async with self.lock:
            now = self.clock()
            expired = self.holdings.expired(now, self.limits.ttl_s)
            if expired:
                await self.delete(expired, "ttl")
            used = self.nvme.used_bytes
            if used > self.limits.nvme_high_bytes and self.s3_usable:
                need = used - self.limits.nvme_low_bytes
                await self.move_down(self.holdings.victims(need, now, tier=NVME))
            cap = self.limits.s3_capacity_bytes
            if cap and self.s3 is not None and self.s3.used_bytes > cap and self.s3_usable:
                victims = self.holdings.victims(self.s3.used_bytes - cap, now, tier=S3)
                await self._drop_copies(victims, S3, "capacity")
