"""Loading a prompt's cached blocks from the nodes the scheduler's plan names.

Each planned source is asked to pin the blocks (a NATS request), they are pulled into blocks
reserved here and verified by the ``BlockPuller``, and the source's pin is released. Whatever
fails (the source is gone, it evicted the blocks, the pull breaks, a block is corrupt) only
shortens what is imported: the engine computes the rest, so a pull can make a request slower,
never wrong.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from shared import subjects
from shared.bus import Bus, BusRequestError
from shared.cluster_messages import LeaseRelease, PinReply, PinRequest, PullPlan
from shared.engine.cache_exchange import PrefixImport
from shared.kv.hashing import BlockHash
from shared.node.engine_host import EngineHost
from shared.node.puller import BlockPuller, PullSource

log = logging.getLogger(__name__)


@dataclass(slots=True)
class FetchedPrefix:
    """Blocks pulled for one request: each import with the checksums of its verified leading
    blocks. The engine caches them right before it admits the request."""

    imports: list[tuple[PrefixImport, list[int]]] = field(default_factory=list)


class PrefixFetcher:
    """Owns nothing but counters; pulls go through the node's ``BlockPuller``."""

    def __init__(
        self, bus: Bus, engine: EngineHost, puller: BlockPuller, pin_timeout_s: float = 2.0
    ) -> None:
        self.bus = bus
        self.engine = engine
        self.puller = puller
        self.pin_timeout_s = pin_timeout_s
        self.pulls_failed = 0

    async def fetch(self, prompt: list[int], salt: bytes, plans: list[PullPlan]) -> FetchedPrefix:
        fetched = FetchedPrefix()
        hashes = self.engine.prompt_hashes(prompt, salt)
        for plan in plans:
            try:
                await self._fetch_one(prompt, salt, hashes, plan, fetched)
            except Exception:
                # Never lose the request over a pull: log, and compute instead.
                self.pulls_failed += 1
                log.exception("pull from %s failed; computing instead", plan.node_id)
        return fetched

    async def _fetch_one(
        self,
        prompt: list[int],
        salt: bytes,
        hashes: list[BlockHash],
        plan: PullPlan,
        fetched: FetchedPrefix,
    ) -> None:
        first = max(await self.engine.num_leading_cached(hashes), plan.first_block)
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
                imp = await self._pull(prompt, salt, hashes, first, plan.node_id, pin)
                if imp is not None:
                    fetched.imports.append(imp)
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
        )
        verified = await self.puller.pull(origin, imp.block_ids)
        return imp, pin.block_checksums[:verified]
