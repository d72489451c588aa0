"""Keeping cached blocks in a pool: a request may ask that its prompt's blocks stay, pinned or
until a time, however hard other requests press on the pool.

A keep is one reference on the block (``BlockPool.touch``), vLLM's way of holding a block: a
referenced block is not in the free queue, so no allocation can evict it. Ending the keep drops
that reference, and the block is an ordinary cached block again. Times are wall-clock seconds,
the clock the catalogue's keep ledger and tierd use too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from shared.kv.hashing import BlockHash
from shared.kv.pool import BlockPool, KVBlock

#: The time of a pinned block: it is kept until a request or the ledger releases it.
PINNED = math.inf


@dataclass(slots=True)
class Kept:
    """One kept block: until when, and since when (a view of the ledger older than that
    cannot know of the keep, so it must not end it)."""

    block: KVBlock
    until: float
    since: float


class PoolKeeps:
    """Owns the keeps of one pool: which cached blocks are kept, and until when.

    Invariants: every kept block is cached and holds exactly one reference for its keep; at
    most ``max_kept`` blocks are kept, so the rest of the pool always serves requests;
    ``_next_expiry`` is at most the earliest ``until`` (a lower bound, so a check is cheap).
    """

    def __init__(self, pool: BlockPool, share: float = 0.5) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"the kept share of a pool must be in [0, 1], got {share}")
        self.pool = pool
        self.max_kept = int(pool.num_blocks * share)
        self._kept: dict[BlockHash, Kept] = {}
        self._next_expiry = math.inf

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._kept

    def until(self, block_hash: BlockHash) -> float | None:
        kept = self._kept.get(block_hash)
        return None if kept is None else kept.until

    def blocks(self) -> list[KVBlock]:
        return [k.block for k in self._kept.values()]

    def keep(self, hashes: list[BlockHash], until: float, now: float) -> int:
        """Keeps the leading blocks of a chain that are cached here until ``until``
        (``PINNED``: until released); a block kept already keeps the later time. Stops at
        the first block not cached (a kept block must lead to nothing that is not) or once
        ``max_kept`` blocks are kept. Returns how many of the chain are kept now."""
        if until <= now:
            return 0
        count = 0
        for block_hash in hashes:
            if not self._keep(block_hash, until, now):
                break
            count += 1
        return count

    def _keep(self, block_hash: BlockHash, until: float, now: float) -> bool:
        kept = self._kept.get(block_hash)
        if kept is not None:
            kept.until = max(kept.until, until)
            return True
        block = self.pool.get_cached_block(block_hash)
        if block is None or len(self._kept) >= self.max_kept:
            return False
        self.pool.touch([block])
        self._kept[block_hash] = Kept(block, until, now)
        self._next_expiry = min(self._next_expiry, until)
        return True

    def release(self, hashes: list[BlockHash]) -> int:
        """Ends the keeps of these blocks; returns how many were kept. Given in chain order,
        the chain's tail becomes the first to be evicted (``BlockPool.free``)."""
        released = [k.block for h in hashes if (k := self._kept.pop(h, None)) is not None]
        if released:
            self.pool.free(released)
        return len(released)

    def expire(self, now: float) -> list[BlockHash]:
        """Ends the keeps whose time has passed; returns their hashes."""
        if now < self._next_expiry:
            return []
        expired = [h for h, k in self._kept.items() if k.until <= now]
        self.release(expired)
        self._next_expiry = min((k.until for k in self._kept.values()), default=math.inf)
        return expired

    def follow(self, ledger: Mapping[BlockHash, float], asked_at: float, now: float) -> int:
        """Brings the keeps in line with the catalogue's ledger (hash -> until) as it stood
        at ``asked_at``: a block the ledger no longer keeps is released, unless its keep began
        after the ledger was read; one the ledger keeps longer is kept longer. Returns how
        many keeps ended."""
        gone = []
        for block_hash, kept in self._kept.items():
            until = ledger.get(block_hash)
            if until is None:
                if kept.since < asked_at:
                    gone.append(block_hash)
            elif until > kept.until:
                kept.until = until
        self.release(gone)
        return len(gone) + len(self.expire(now))
