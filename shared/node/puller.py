"""Pulling KV blocks from another node into this node's pool, verified block by block: the one
path behind a decode node taking a prefill's hand-off and a node loading a peer's prefix."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.kv.checksum import BlockChecksum
from shared.model.kv_cache import PagedKVCache
from shared.transfer.base import TransferClient, TransferError, create_client

if TYPE_CHECKING:
    from shared.node.metrics import NodeMetrics

log = logging.getLogger(__name__)
#: What a pull's blocks are, for the metrics: a prefill node's hand-off, or a cached prefix
#: from another node's pool (``peer``) or a tierd's tier (``nvme``, ``s3``).
HANDOFF, PEER = "handoff", "peer"


@dataclass(slots=True)
class FetchBandwidth:
    """Owns the measured bandwidth of this node's pulls, per source node: an exponentially
    weighted mean of bytes/s over pulls, so one slow pull moves it but does not define it."""

    weight: float = 0.3
    by_source: dict[str, float] = field(default_factory=dict)

    def record(self, source: str, num_bytes: int, seconds: float) -> None:
        if num_bytes <= 0 or seconds <= 0:
            return
        rate = num_bytes / seconds
        old = self.by_source.get(source)
        self.by_source[source] = rate if old is None else old + self.weight * (rate - old)


@dataclass(frozen=True, slots=True)
class PullSource:
    """Blocks another node holds for us under ``lease_id``, with the checksum of each;
    ``kind`` says what they are (``HANDOFF``, ``PEER``, or the tier a tierd read them from)."""

    node_id: str
    transfer_kind: str
    address: bytes
    lease_id: str
    block_ids: list[int]
    checksums: list[int]
    kind: str = PEER


class BlockPuller:
    """Owns one transfer client per transport kind, the pull counters and the bandwidth
    measured per source.

    Invariant: ``pull`` never raises for a failed or corrupt pull; it reports how many leading
    blocks arrived intact, and the caller computes the rest. Bytes past the first bad block
    are never used.
    """

    def __init__(
        self, cache: PagedKVCache, checksum: BlockChecksum, timeout_s: float = 10.0
    ) -> None:
        self.cache = cache
        self.checksum = checksum
        self.timeout_s = timeout_s
        self.bandwidth = FetchBandwidth()
        self.clients: dict[str, TransferClient] = {}
        self.pulls_ok = 0
        self.pulls_failed = 0
        self.blocks_pulled = 0
        self.metrics: NodeMetrics | None = None

    async def pull(self, source: PullSource, dest_block_ids: list[int]) -> int:
        """Fills ``dest_block_ids`` with the first ``len(dest_block_ids)`` source blocks;
        returns how many leading ones match their checksums (0 when the pull failed)."""
        count = min(len(dest_block_ids), len(source.block_ids), len(source.checksums))
        if count == 0:
            return 0
        dest = [self.cache.block_buffer(b) for b in dest_block_ids[:count]]
        started = time.perf_counter()
        try:
            client = self._client(source.transfer_kind)
            received = await client.pull(
                source.address, source.lease_id, source.block_ids[:count], dest
            )
        except TransferError as exc:
            self.pulls_failed += 1
            self._observe(source, 0, time.perf_counter() - started, ok=False)
            log.warning("pull from %s failed (%s); computing instead", source.node_id, exc)
            return 0
        seconds = time.perf_counter() - started
        self.bandwidth.record(source.node_id, received, seconds)
        sums = await asyncio.to_thread(lambda: [self.checksum(d.data) for d in dest])
        verified = _leading_matches(sums, source.checksums[:count])
        self._observe(source, received, seconds, ok=verified == count)
        if verified < count:
            self.pulls_failed += 1
            if self.metrics is not None:
                self.metrics.corrupt(source.kind)
            log.warning(
                "block %d pulled from %s is corrupt; computing it", verified, source.node_id
            )
        else:
            self.pulls_ok += 1
        self.blocks_pulled += verified
        return verified

    def _observe(self, source: PullSource, num_bytes: int, seconds: float, ok: bool) -> None:
        if self.metrics is not None:
            self.metrics.pulled(source.transfer_kind, source.kind, num_bytes, seconds, ok)

    def _client(self, kind: str) -> TransferClient:
        client = self.clients.get(kind)
        if client is None:
            client = self.clients[kind] = create_client(kind, timeout_s=self.timeout_s)
        return client

    @property
    def bytes_received(self) -> int:
        return sum(c.bytes_received for c in self.clients.values())

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()


def _leading_matches(actual: list[int], expected: list[int]) -> int:
    """How many leading checksums match: a chain is only usable up to its first bad block."""
    count = 0
    for got, want in zip(actual, expected, strict=False):
        if got != want:
            break
        count += 1
    return count
