"""tierd's record in cachemeta: its replicas on NVMe and in S3, and its heartbeat there."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence

from shared.kv.block_file import BlockHeader
from shared.kv_event_feed import ChainBlock, KvEventFeed
from shared.rpc.client import CacheMetaClient, CacheMetaError, CacheMetaUnavailable
from shared.rpc.types import BlockRecord, TierCapacity

log = logging.getLogger(__name__)
CatalogueDown = (CacheMetaUnavailable, CacheMetaError)


def record(header: BlockHeader) -> BlockRecord:
    # No token ids: the catalogue knows blocks by hash, and the ids are users' text.
    return BlockRecord(header.block_hash, header.parent_hash, (), header.num_bytes, header.checksum)


class TierCatalogue:
    """Owns tierd's catalogue session: its epoch and whether cachemeta is known to list exactly
    what the tiers hold.

    Invariant: whenever a register or drop may have been lost (cachemeta unreachable, its
    database down, a new epoch, a restart of either side), ``in_step`` is False until a resync
    has replaced each tier's whole record with what the tier holds. That replacement is the
    reconciliation: orphan blocks get rows, rows without blocks go. The KV events (``events``)
    carry what cachemeta took, and a resend they owe is a resync too.
    """

    def __init__(
        self,
        client: CacheMetaClient,
        node_id: str,
        contents: Callable[[str], Iterable[BlockHeader]],
        tiers: Callable[[], list[TierCapacity]],
        tier_names: Sequence[str],
        heartbeat_interval_s: float = 1.0,
    ) -> None:
        self.client = client
        self.node_id = node_id
        self.epoch = uuid.uuid4().hex
        self._contents = contents
        self._tiers = tiers
        self.tier_names = tuple(tier_names)
        self.heartbeat_interval_s = heartbeat_interval_s
        self.in_step = False
        #: Where the same changes go out as KV events, once the wiring sets it.
        self.events: KvEventFeed | None = None
        self._outage = False

    async def tick(self) -> None:
        """One heartbeat, with a resync when needed. An unreachable cachemeta is an outage,
        logged once and resynced after; any other failure raises for the lifecycle to log and
        count. Either leaves a resync pending (``_guard``)."""
        try:
            await self._guard(self.beat())
        except CatalogueDown as exc:
            if not self._outage:
                log.warning("cachemeta unreachable (%s); will resync when it is back", exc)
            self._outage = True
            return
        if self._outage:
            log.info("cachemeta is reachable again; tiers resynced")
        self._outage = False

    async def beat(self) -> None:
        resync = await self.client.heartbeat(self.node_id, "tierd", self.epoch, self._tiers())
        owed = self.events is not None and self.events.take_resend()
        if resync or owed or not self.in_step:
            await self.resync()

    async def resync(self) -> None:
        for tier in self.tier_names:
            headers = list(self._contents(tier))
            records = [record(h) for h in headers]
            await self.client.register_blocks(self.node_id, tier, records, replace=True)
            if self.events is not None:
                await self.events.replaced(tier, _chain(headers))
        self.in_step = True

    async def register(self, tier: str, headers: Sequence[BlockHeader]) -> None:
        """Lists new copies; raises (CatalogueDown) and leaves ``in_step`` False on failure."""
        if headers:
            await self._guard(
                self.client.register_blocks(self.node_id, tier, [record(h) for h in headers])
            )
            if self.events is not None:
                await self.events.stored(tier, _chain(headers))

    async def drop(self, tier: str, block_hashes: Sequence[bytes]) -> bool:
        """Unlists copies; False (and a resync pending) when cachemeta did not take it."""
        if not block_hashes:
            return True
        try:
            await self._guard(self.client.drop_blocks(self.node_id, tier, block_hashes))
        except CatalogueDown:
            return False
        if self.events is not None:
            await self.events.removed(tier, block_hashes)
        return True

    async def _guard(self, call: Awaitable[object]) -> None:
        try:
            await call
        except BaseException:
            self.in_step = False
            raise

    async def leave(self) -> None:
        """A clean stop keeps the rows: the blocks stay on disk and in S3 for the next run."""
        await self.client.close()


def _chain(headers: Iterable[BlockHeader]) -> list[ChainBlock]:
    return [ChainBlock(h.block_hash, h.parent_hash, h.block_size) for h in headers]
