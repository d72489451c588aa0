"""Loading a prompt's cached blocks from the nodes the scheduler's plan names.

Each planned source is asked to pin the blocks (a NATS request), they are pulled into blocks
reserved here and verified by the ``BlockPuller``, and the source's pin is released. A source
may be a peer's pool or a tierd's lower tier (which reads the blocks up before it answers);
NVMe blocks of this host's tierd may instead be read from its files here (``DirectReader``),
whichever has measured faster. Whatever
fails (the source is gone, it evicted the blocks, the pull breaks, a block is corrupt) only
shortens what is imported: the engine computes the rest, so a pull can make a request slower,
never wrong.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shared import subjects
from shared.bus import Bus, BusRequestError
from shared.cluster_messages import CorruptBlocks, LeaseRelease, PinReply, PinRequest, PullPlan
from shared.engine.cache_exchange import PrefixImport
from shared.kv.hashing import BlockHash
from shared.kv.tiers import DRAM, LOWER_TIERS, NVME, S3, bandwidth_key
from shared.node.direct import DirectReader
from shared.node.engine_host import EngineHost
from shared.node.puller import PEER, BlockPuller, PullSource
from shared.sampling_params import SamplingParams

log = logging.getLogger(__name__)

#: What a pin from a tierd may add per block read up (1.5 MB blocks from a busy S3 server
#: at 15 MB/s): a pin that times out is recomputed, and its staged blocks wait out their lease.
LOWER_TIER_PIN_S_PER_BLOCK = 0.1


@dataclass(slots=True)
class FetchedPrefix:
    """Blocks pulled for one request: each import with the checksums of its verified leading
    blocks. The engine caches them right before it admits the request. ``blocks_by_tier``
    counts the verified blocks per tier they came from."""

    imports: list[tuple[PrefixImport, list[int]]] = field(default_factory=list)
    blocks_by_tier: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # how long fetching it took

    def add(
        self,
        imp: PrefixImport,
        checksums: list[int],
        tier: str,
        block_tiers: Sequence[str] = (),
    ) -> None:
        """``block_tiers``: where each block came from, when the source says (a tierd reads
        each from the fastest tier holding it); else all from ``tier``."""
        imp.sunk = tier != DRAM  # the lower tier keeps its copy
        self.imports.append((imp, checksums))
        for i in range(len(checksums)):
            came_from = block_tiers[i] if i < len(block_tiers) else tier
            self.blocks_by_tier[came_from] = self.blocks_by_tier.get(came_from, 0) + 1

    def tokens_by_tier(self, num_cached_tokens: int, block_size: int) -> dict[str, int]:
        """``num_cached_tokens`` split by tier: what came from below DRAM, the rest from a
        pool (this node's or a peer's)."""
        split = {DRAM: 0, NVME: 0, S3: 0}
        left = num_cached_tokens
        for tier in LOWER_TIERS:
            split[tier] = min(left, self.blocks_by_tier.get(tier, 0) * block_size)
            left -= split[tier]
        split[DRAM] = left
        return split

    def tokens_by_source(self, num_cached_tokens: int, block_size: int) -> dict[str, int]:
        """``num_cached_tokens`` split by where they were found: this node's ``pool``, a
        ``peer``'s pool, or a tierd's ``nvme`` or ``s3``; what no pull brought was the pool's."""
        split = self.tokens_by_tier(num_cached_tokens, block_size)
        peer = min(split[DRAM], self.blocks_by_tier.get(DRAM, 0) * block_size)
        return {"pool": split[DRAM] - peer, PEER: peer, NVME: split[NVME], S3: split[S3]}


class PrefixFetcher:
    """Owns nothing but counters; pulls go through the node's ``BlockPuller``, direct NVMe
    reads through its ``DirectReader`` (None: this node reads no files)."""

    def __init__(
        self,
        bus: Bus,
        engine: EngineHost,
        puller: BlockPuller,
        pin_timeout_s: float = 2.0,
        direct: DirectReader | None = None,
    ) -> None:
        self.bus = bus
        self.engine = engine
        self.puller = puller
        self.pin_timeout_s = pin_timeout_s
        self.direct = direct
        self.pulls_failed = 0

    def pin_timeout(self, tier: str, num_blocks: int) -> float:
        """How long a pin may take: a pool pins at once, a tierd reads every block up from
        NVMe or S3 first, which on a busy host takes its time per block."""
        if tier == DRAM:
            return self.pin_timeout_s
        return self.pin_timeout_s + LOWER_TIER_PIN_S_PER_BLOCK * num_blocks

    async def admit(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        salt: bytes,
        plans: list[PullPlan],
        keep: Callable[[FetchedPrefix], bool],
        *,
        hold_blocks: bool = False,
    ) -> bool:
        """Pulls the planned prefix, then admits the request in the same engine call that
        caches the pulled blocks, so they are claimed before anything can evict them.
        ``keep`` records what was pulled and says whether the request is still wanted; when
        it is not (aborted meanwhile), the blocks are cached without it and this returns
        False. Raises ``InvalidRequestError`` if the engine can never serve the request."""
        fetched = await self.fetch(prompt, salt, plans) if plans else FetchedPrefix()
        if not keep(fetched):
            await self.engine.cache_imports(fetched.imports)
            return False
        await self.engine.add(
            request_id, prompt, params, salt, hold_blocks=hold_blocks, imports=fetched.imports
        )
        return True

    async def fetch(self, prompt: list[int], salt: bytes, plans: list[PullPlan]) -> FetchedPrefix:
        started = time.monotonic()
        fetched = FetchedPrefix()
        hashes = self.engine.prompt_hashes(prompt, salt)
        for i, plan in enumerate(plans):
            try:
                await self._fetch_one(prompt, salt, hashes, plan, fetched, i == len(plans) - 1)
            except Exception:
                # Never lose the request over a pull: log, and compute instead.
                self.pulls_failed += 1
                log.exception("pull from %s failed; computing instead", plan.node_id)
        fetched.seconds = time.monotonic() - started
        return fetched

    async def _fetch_one(
        self,
        prompt: list[int],
        salt: bytes,
        hashes: list[BlockHash],
        plan: PullPlan,
        fetched: FetchedPrefix,
        last: bool,
    ) -> None:
        first = max(await self.engine.num_leading_cached(hashes), plan.first_block)
        end = min(plan.first_block + plan.num_blocks, len(hashes))
        if plan.tier != DRAM and last:
            # A tierd reads each block from whichever tier holds it, and the catalogue counts
            # runs per tier: a chain cut at its tail to S3 may go on beyond what was priced.
            end = len(hashes)
        if first >= end:
            return
        key = bandwidth_key(plan.node_id, plan.tier)
        direct = self.direct if plan.tier == NVME else None
        if direct is not None and direct.prefer(
            plan.node_id, self.puller.bandwidth.by_source.get(key)
        ):
            first += await self._read_direct(prompt, salt, hashes, first, end, plan, fetched)
            if first >= end:
                return
            # The files ran out (moved to S3 meanwhile, damaged): tierd has the rest, if anyone.
        # A tierd stages what its memory holds (CRESCENT_STAGING_MB): a long prefix of a large
        # model's KV comes in several pins, each released before the next is asked.
        while first < end:
            pulled = await self._pin_and_pull(prompt, salt, hashes, first, end, plan, key, fetched)
            if pulled <= 0 or plan.tier == DRAM:
                return
            first += pulled

    async def _pin_and_pull(
        self,
        prompt: list[int],
        salt: bytes,
        hashes: list[BlockHash],
        first: int,
        end: int,
        plan: PullPlan,
        key: str,
        fetched: FetchedPrefix,
    ) -> int:
        """Pins ``hashes[first:end]`` at the plan's source and pulls what it pinned; the
        number of blocks pulled and verified."""
        try:
            pin = await self.bus.request(
                subjects.peer_pins(plan.node_id),
                PinRequest(block_hashes=hashes[first:end], tier=plan.tier),
                PinReply,
                self.pin_timeout(plan.tier, end - first),
            )
        except BusRequestError as exc:
            self.pulls_failed += 1
            log.warning("peer %s did not pin blocks (%s); computing instead", plan.node_id, exc)
            return 0
        try:
            if not pin.block_ids:
                return 0
            pulled = await self._pull(prompt, salt, hashes, first, key, pin, plan.tier)
            if pulled is None:
                return 0
            fetched.add(*pulled, plan.tier, pin.block_tiers)
            return len(pulled[1])
        finally:
            if pin.lease_id:
                release = LeaseRelease(lease_id=pin.lease_id)
                await self.bus.publish(subjects.lease_releases(plan.node_id), release)

    async def _pull(
        self,
        prompt: list[int],
        salt: bytes,
        hashes: list[BlockHash],
        first: int,
        source: str,
        pin: PinReply,
        tier: str,
    ) -> tuple[PrefixImport, list[int]] | None:
        count = min(len(pin.block_ids), len(pin.block_checksums))
        imp = await self.engine.begin_prefix_import(prompt, salt, hashes, first, count)
        if imp is None:
            return None
        origin = PullSource(
            source,
            pin.transfer_kind,
            pin.transfer_address,
            pin.lease_id,
            pin.block_ids,
            pin.block_checksums,
            PEER if tier == DRAM else tier,
        )
        verified = await self.puller.pull(origin, imp.block_ids)
        return imp, pin.block_checksums[:verified]

    async def _read_direct(
        self,
        prompt: list[int],
        salt: bytes,
        hashes: list[BlockHash],
        first: int,
        end: int,
        plan: PullPlan,
        fetched: FetchedPrefix,
    ) -> int:
        """Reads blocks ``first:end`` from this host's files; how many leading ones it got."""
        assert self.direct is not None
        imp = await self.engine.begin_prefix_import(prompt, salt, hashes, first, end - first)
        if imp is None:
            return 0
        read = await self.direct.read(imp.block_hashes, imp.block_ids)
        if read.corrupt:
            # tierd checks the file again itself before it drops the replica.
            report = CorruptBlocks(block_hashes=read.corrupt, tier=NVME)
            await self.bus.publish(subjects.corrupt_reports(plan.node_id), report)
        fetched.add(imp, read.checksums, NVME)
        return read.verified
