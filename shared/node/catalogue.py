"""Keeps cachemeta's record of one node's DRAM blocks in step with the node's pool."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence

from shared.engine.cache_exchange import CachedBlock
from shared.kv_event_feed import ChainBlock, KvEventFeed
from shared.node.engine_host import EngineHost
from shared.rpc.client import CacheMetaClient, CacheMetaError, CacheMetaUnavailable
from shared.rpc.types import BlockRecord, TierCapacity

log = logging.getLogger(__name__)
TIER = "dram"


class CatalogueSync:
    """Owns this node's catalogue session: its epoch and whether cachemeta is known to be in
    step with the pool.

    Invariant: whenever a register or drop may have been lost (cachemeta unreachable, its
    database down, a new epoch), ``in_step`` is False, and the next round replaces the node's
    whole record with a snapshot of the pool instead of sending events. The KV events
    (``events``) carry what cachemeta took, and a resend they owe is a resync too.
    """

    def __init__(
        self,
        client: CacheMetaClient,
        engine: EngineHost,
        node_id: str,
        role: str,
        block_bytes: int,
        *,
        sync_interval_s: float = 0.2,
        heartbeat_interval_s: float = 1.0,
    ) -> None:
        self.client = client
        self.engine = engine
        self.node_id = node_id
        self.role = role
        self.block_bytes = block_bytes
        self.sync_interval_s = sync_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.epoch = uuid.uuid4().hex
        self.in_step = False
        #: Where the same changes go out as KV events, once the wiring sets it.
        self.events: KvEventFeed | None = None
        self._last_beat = 0.0
        self._outage = False

    async def tick(self) -> None:
        """One sync round. While cachemeta cannot be reached the failure is logged once per
        outage and the next round resyncs; any other failure also forces a resync, and is
        raised for the lifecycle to log and count."""
        try:
            await self.sync_once()
        except (CacheMetaUnavailable, CacheMetaError) as exc:
            self.in_step = False
            if not self._outage:
                log.warning("cachemeta sync failed (%s); will resync when it is back", exc)
            self._outage = True
            return
        except Exception:
            self.in_step = False
            raise
        if self._outage:
            log.info("cachemeta is reachable again; catalogue resynced")
        self._outage = False

    async def sync_once(self) -> None:
        now = time.monotonic()
        if now - self._last_beat >= self.heartbeat_interval_s or not self.in_step:
            resync = await self.client.heartbeat(self.node_id, self.role, self.epoch, self._tiers())
            self._last_beat = now
            if resync:
                self.in_step = False
        if self.events is not None and self.events.take_resend():
            self.in_step = False
        if not self.in_step:
            await self._resync()
            return
        stored, evicted = await self.engine.drain_events()
        # A failure from here on loses these events; in_step=False (set by tick) recovers.
        self.in_step = False
        if evicted:
            await self.client.drop_blocks(self.node_id, TIER, evicted)
        if stored:
            await self.client.register_blocks(self.node_id, TIER, self._records(stored))
        if self.events is not None:
            await self.events.removed(TIER, evicted)
            await self.events.stored(TIER, _chain(stored))
        self.in_step = True

    async def leave(self) -> None:
        """A clean stop withdraws the node's blocks at once instead of after the grace, then
        closes the client."""
        try:
            await asyncio.wait_for(self.drop_all(), 2.0)
        except Exception as exc:
            log.warning("could not withdraw blocks from cachemeta: %s", exc)
        await self.client.close()

    async def drop_all(self) -> None:
        """Tells cachemeta this node holds nothing any more (a clean shutdown)."""
        await self.client.register_blocks(self.node_id, TIER, [], replace=True)

    async def _resync(self) -> None:
        blocks = await self.engine.snapshot()
        await self.client.register_blocks(self.node_id, TIER, self._records(blocks), replace=True)
        if self.events is not None:
            await self.events.replaced(TIER, _chain(blocks))
        self.in_step = True

    def _records(self, blocks: Sequence[CachedBlock]) -> list[BlockRecord]:
        return [
            BlockRecord(b.block_hash, b.parent_hash, b.token_ids, self.block_bytes, b.checksum)
            for b in blocks
        ]

    def _tiers(self) -> list[TierCapacity]:
        total, used = self.engine.pool_usage()
        return [TierCapacity(TIER, total * self.block_bytes, used * self.block_bytes)]


def _chain(blocks: Sequence[CachedBlock]) -> list[ChainBlock]:
    return [ChainBlock(b.block_hash, b.parent_hash, len(b.token_ids)) for b in blocks]
