"""Reading NVMe blocks straight from the files of this host's tierd, into the pool.

A node on the same host as its tierd can skip tierd and the transfer: it opens the block
files itself and reads each payload into the pool block reserved for it, verifying the file's
header and keyed tags as tierd would (so it needs tierd's keys, those of the cache secret).
Whether that beats asking tierd is measured, not assumed: both paths keep a bandwidth, the
faster one is used, and the other is tried now and then so its figure stays current.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from shared import subjects
from shared.kv.block_file import BlockFormatError, Layout, file_name
from shared.kv.block_io import read_into
from shared.kv.hashing import BlockHash
from shared.kv.seal import BlockSeal
from shared.kv.tiers import NVME, bandwidth_key
from shared.model.kv_cache import PagedKVCache
from shared.node.puller import FetchBandwidth

if TYPE_CHECKING:
    from shared.node.engine_host import EngineHost
    from shared.node.metrics import NodeMetrics
    from shared.node.settings import NodeSettings

log = logging.getLogger(__name__)
#: One fetch in this many takes the path that measured slower, to keep measuring it.
EXPLORE_EVERY = 16


@dataclass(slots=True)
class DirectRead:
    """How a direct read went: the checksums of the leading blocks verified, and the hashes
    of damaged files."""

    checksums: list[int] = field(default_factory=list)
    corrupt: list[BlockHash] = field(default_factory=list)

    @property
    def verified(self) -> int:
        return len(self.checksums)


class DirectReader:
    """Owns the NVMe directory this node may read (that of ``tierd_id``, the tierd of its
    host), the layout its files must have, and the bandwidth of its direct reads.

    Invariant: a block counts as read only if its file's header names that block in this
    node's layout and its keyed tags and checksum verify; reading stops at the first block
    that is missing or bad, since a prefix is only usable up to its first gap. Without a
    ``seal`` (the keys tierd writes with) no direct read is made: the files cannot be checked.
    """

    def __init__(
        self,
        root: Path,
        tierd_id: str,
        cache: PagedKVCache,
        layout: Layout,
        seal: BlockSeal | None = None,
    ) -> None:
        self.root = root
        self.seal = seal
        self.tierd_id = tierd_id
        self.cache = cache
        self.layout = layout
        self.bandwidth = FetchBandwidth()
        self.corrupt_blocks = 0
        self._choices = 0
        self.metrics: NodeMetrics | None = None

    def prefer(self, tierd_id: str, via_tierd_rate: float | None) -> bool:
        """Whether the next NVMe fetch from ``tierd_id`` reads the files here rather than
        through tierd (only this host's tierd has its files here)."""
        if tierd_id != self.tierd_id or self.seal is None:
            return False
        self._choices += 1
        mine = self.bandwidth.by_source.get("direct")
        if mine is None or via_tierd_rate is None:
            return mine is None  # measure each path once before comparing
        faster = mine >= via_tierd_rate
        return faster != (self._choices % EXPLORE_EVERY == 0)

    def merged(self, measured: dict[str, float]) -> dict[str, float]:
        """``measured`` pull bandwidths with the local tierd's NVMe figure raised to this
        path's when it is faster: what the scheduler should expect of this node's fetches."""
        mine = self.bandwidth.by_source.get("direct")
        if mine is None:
            return measured
        key = bandwidth_key(self.tierd_id, NVME)
        return measured | {key: max(measured.get(key, 0.0), mine)}

    async def read(self, hashes: list[BlockHash], dest_block_ids: list[int]) -> DirectRead:
        started = time.perf_counter()
        result = await asyncio.to_thread(self._read_all, hashes, dest_block_ids)
        num_bytes = result.verified * self.layout.num_bytes
        seconds = time.perf_counter() - started
        self.bandwidth.record("direct", num_bytes, seconds)
        if self.metrics is not None:
            self.metrics.pulled("file", NVME, num_bytes, seconds, ok=not result.corrupt)
            if result.corrupt:
                self.metrics.corrupt(NVME, len(result.corrupt))
        return result

    def _read_all(self, hashes: list[BlockHash], dest_block_ids: list[int]) -> DirectRead:
        read = DirectRead()
        if self.seal is None:
            return read
        for block_hash, block_id in zip(hashes, dest_block_ids, strict=False):
            dest = self.cache.block_buffer(block_id).data.cast("B")
            try:
                path = self.root / file_name(block_hash)
                header = read_into(path, dest, block_hash, self.layout, self.seal)
            except FileNotFoundError:
                break  # moved on to S3 or deleted meanwhile: not damage
            except BlockFormatError as exc:
                self.corrupt_blocks += 1
                log.warning("NVMe block %s is damaged (%s); computing it", block_hash.hex(), exc)
                read.corrupt.append(block_hash)
                break
            except OSError as exc:
                log.warning("reading NVMe block %s failed: %s", block_hash.hex(), exc)
                break
            read.checksums.append(header.checksum)
        return read


def direct_reader(settings: NodeSettings, engine: EngineHost) -> DirectReader | None:
    """The reader of this host's tierd's NVMe files for a node, None without
    ``CRESCENT_NVME_DIR``. It only reads: whether new writes are encrypted is tierd's setting."""
    if not settings.nvme_dir:
        return None
    config, cache = engine.config, engine.cache
    layout = Layout(engine.model_id, config.block_size, config.kv_dtype, engine.block_bytes)
    tierd_id = settings.tierd_id or f"tierd-{subjects.host_id(settings.host_id)}"
    seal = BlockSeal(settings.cache_secret, NVME)
    return DirectReader(Path(settings.nvme_dir), tierd_id, cache, layout, seal)
