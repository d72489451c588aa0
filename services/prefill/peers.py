"""Loading a prompt's cached blocks from peer prefill nodes, as the scheduler planned.

Each planned source is asked to pin the blocks (a NATS request), they are pulled into blocks
reserved here, every checksum is verified, and the peer's pin is released. Whatever fails —
the peer is gone, it evicted the blocks, the pull breaks, a block is corrupt — only shortens
what is imported: the engine computes the rest, so a pull can make a request slower, never
wrong.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from shared import subjects
from shared.bus import Bus, BusRequestError
from shared.cluster_messages import LeaseRelease, PinReply, PinRequest, PullPlan
from shared.engine.async_engine import AsyncEngine
from shared.engine.cache_exchange import PrefixImport
from shared.kv.hashing import BlockHash, block_checksum
from shared.model.kv_cache import PagedKVCache
from shared.node.common import FetchBandwidth
from shared.transfer.base import TransferClient, TransferError, create_client

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FetchedPrefix:
    """Blocks pulled for one request: each import with the checksums of its verified leading
    blocks. The engine caches them right before it admits the request."""

    imports: list[tuple[PrefixImport, list[int]]] = field(default_factory=list)


class PeerFetcher:
    """Owns one transfer client per kind for pulls from peers, and pull counters."""

    def __init__(
        self,
        bus: Bus,
        engine: AsyncEngine,
        cache: PagedKVCache,
        bandwidth: FetchBandwidth,
        pin_timeout_s: float = 2.0,
    ) -> None:
        self.bus = bus
        self.engine = engine
        self.cache = cache
        self.bandwidth = bandwidth
        self.pin_timeout_s = pin_timeout_s
        self.clients: dict[str, TransferClient] = {}
        self.blocks_pulled = 0
        self.pulls_failed = 0

    async def fetch(self, prompt: list[int], salt: bytes, plans: list[PullPlan]) -> FetchedPrefix:
        fetched = FetchedPrefix()
        for plan in plans:
            try:
                await self._fetch_one(prompt, salt, plan, fetched)
            except Exception:
                # Never lose the request over a pull: log, and compute instead.
                self.pulls_failed += 1
                log.exception("pull from %s failed; computing instead", plan.node_id)
        return fetched

    async def _fetch_one(
        self, prompt: list[int], salt: bytes, plan: PullPlan, fetched: FetchedPrefix
    ) -> None:
        exchange = self.engine.engine.exchange
        # Hashing needs no lock; only the lookup in the pool does.
        hashes = exchange.prompt_hashes(prompt, salt)
        first = await self.engine.call_now(lambda: exchange.num_leading_cached(hashes))
        first = max(first, plan.first_block)
        end = min(plan.first_block + plan.num_blocks, len(hashes))
        if first >= end:
            return
        try:
            pin = await self.bus.request(
                subjects.peer_pins(plan.node_id),
                PinRequest(block_hashes=hashes[first:end]),
                PinReply,
                self.pin_timeout_s,
            )
        except BusRequestError as exc:
            self.pulls_failed += 1
            log.warning("peer %s did not pin blocks (%s); computing instead", plan.node_id, exc)
            return
        try:
            if pin.block_ids:
                await self._pull_pinned(prompt, salt, hashes, first, plan.node_id, pin, fetched)
        finally:
            if pin.lease_id:
                await self.bus.publish(
                    subjects.lease_releases(plan.node_id), LeaseRelease(lease_id=pin.lease_id)
                )

    async def _pull_pinned(
        self,
        prompt: list[int],
        salt: bytes,
        hashes: list[BlockHash],
        first: int,
        source: str,
        pin: PinReply,
        fetched: FetchedPrefix,
    ) -> None:
        count = min(len(pin.block_ids), len(pin.block_checksums))
        exchange = self.engine.engine.exchange
        imp = await self.engine.call_now(
            lambda: exchange.begin_import(prompt, salt, hashes, first, count)
        )
        if imp is None:
            return
        dest = [self.cache.block_buffer(b) for b in imp.block_ids]
        source_ids = pin.block_ids[: len(dest)]
        started = time.perf_counter()
        try:
            client = self._client(pin.transfer_kind)
            received = await client.pull(pin.transfer_address, pin.lease_id, source_ids, dest)
        except TransferError as exc:
            self.pulls_failed += 1
            log.warning("pull from %s failed (%s); computing instead", source, exc)
            fetched.imports.append((imp, []))
            return
        self.bandwidth.record(source, received, time.perf_counter() - started)
        sums = await asyncio.to_thread(lambda: [block_checksum(d.data) for d in dest])
        verified = _matching_prefix(sums, pin.block_checksums)
        if len(verified) < len(dest):
            self.pulls_failed += 1
            log.warning("block %d pulled from %s is corrupt; computing it", len(verified), source)
        self.blocks_pulled += len(verified)
        fetched.imports.append((imp, verified))

    def _client(self, kind: str) -> TransferClient:
        client = self.clients.get(kind)
        if client is None:
            client = self.clients[kind] = create_client(kind)
        return client

    @property
    def bytes_received(self) -> int:
        return sum(c.bytes_received for c in self.clients.values())

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


def _matching_prefix(actual: list[int], expected: list[int]) -> list[int]:
    """The leading checksums that match: a chain is only usable up to its first bad block."""
    good: list[int] = []
    for got, want in zip(actual, expected, strict=False):
        if got != want:
            break
        good.append(got)
    return good
