"""Cached KV blocks crossing the engine's edge: what the catalogue learns of the pool, blocks
pinned for a peer's pull, and prompt prefixes imported from a peer.

Every method runs holding the engine's lock (``shared.node.engine_host.EngineHost``'s
bookkeeping calls), which a step takes while it plans and books but not during its forward
pass. So a method may run while the model computes; that is safe because each touches only
blocks no running sequence is writing (cached, pinned or free blocks) and the pool's
bookkeeping, which the step only changes under the lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from shared.kv.hashing import BlockHash, hash_reusable_blocks, quota_key
from shared.kv.keeps import PoolKeeps
from shared.kv.pool import BlockPool, KVBlock


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """A cached full block as the catalogue records it."""

    block_id: int
    block_hash: BlockHash
    parent_hash: BlockHash
    token_ids: tuple[int, ...]
    checksum: int
    quota_key: bytes = b""


@dataclass(slots=True)
class PrefixImport:
    """Fresh blocks reserved for prompt blocks ``first_block ..`` pulled from a peer, what
    each will be cached as, and the local leading blocks held meanwhile so that nothing evicts
    them before the request runs."""

    first_block: int
    block_ids: list[int]
    block_hashes: list[BlockHash]
    parent_hashes: list[BlockHash]
    token_ids: list[list[int]]
    fresh: list[KVBlock]
    protected: list[KVBlock]
    quota_key: bytes = b""
    sunk: bool = False  # read up from a lower tier, which keeps its copy


class CacheExchange:
    """Owns the pins held for peers (pin id -> blocks, one reference each).

    Invariant: a pinned block keeps one extra reference until ``unpin``; an import's blocks
    are referenced until ``finish_import``, which leaves the verified ones cached and
    unreferenced (reusable at once) and returns the rest to the pool.
    """

    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        root: Callable[[bytes], BlockHash],
        checksum: Callable[[int], int],
        keeps: PoolKeeps | None = None,
    ) -> None:
        self.pool = pool
        self.keeps = keeps
        self.block_size = block_size
        self._root = root
        self._checksum = checksum

    def drain_events(self) -> tuple[list[CachedBlock], list[BlockHash]]:
        """Blocks cached and hashes evicted since the last drain (or snapshot)."""
        stored, evicted = self.pool.drain_events()
        entries = []
        for block_hash in stored:
            block = self.pool.get_cached_block(block_hash)
            if block is not None:
                entries.append(self._entry(block))
        return entries, evicted

    def snapshot(self) -> list[CachedBlock]:
        """Every cached block; pending events are dropped, since this supersedes them."""
        self.pool.drain_events()
        return [self._entry(b) for b in self.pool.cached_blocks()]

    def prompt_hashes(self, prompt: list[int], cache_salt: bytes) -> list[BlockHash]:
        """Hashes of the prompt's blocks that a prefix hit may cover."""
        return hash_reusable_blocks(prompt, self.block_size, self._root(cache_salt))

    def num_leading_cached(self, hashes: list[BlockHash]) -> int:
        count = 0
        for block_hash in hashes:
            if self.pool.get_cached_block(block_hash) is None:
                break
            count += 1
        return count

    def pin(self, hashes: list[BlockHash]) -> list[tuple[int, int]]:
        """Holds the leading blocks of ``hashes`` that are cached here, for a peer to pull;
        returns ``(block_id, checksum)`` of each, possibly none. The caller owns the pin: it
        ends it once with ``unpin`` of the same block ids."""
        blocks = [self.pool.get_cached_block(h) for h in hashes[: self.num_leading_cached(hashes)]]
        held = [b for b in blocks if b is not None]
        if not held:
            return []
        self.pool.touch(held)
        return [(b.block_id, self._entry(b).checksum) for b in held]

    def unpin(self, block_ids: list[int]) -> None:
        """Ends a pin (``pin`` or ``offer_sink``) of these blocks: they stay cached."""
        self.pool.free([self.pool.blocks[i] for i in block_ids])

    def offer_sink(self, max_blocks: int, skip: Callable[[BlockHash], bool]) -> list[CachedBlock]:
        """Pins up to ``max_blocks`` cached blocks no lower tier holds yet (``skip`` leaves
        out those already on their way down), for tierd to copy: kept blocks first (a copy
        below is what keeps them if this node dies), then the coldest unreferenced ones.

        At most a quarter of the free blocks are pinned at once, so a sink never keeps the
        pool from admitting a request (kept blocks are held already and take none); the pin
        lasts only as long as the copy, and its caller ends it with ``unpin``.
        """

        def wanted(block: KVBlock) -> bool:
            return block.block_hash is not None and not block.sunk and not skip(block.block_hash)

        kept = self.keeps.blocks() if self.keeps is not None else []
        chosen = [b for b in kept if wanted(b)][:max_blocks]
        limit = min(max_blocks, len(chosen) + len(self.pool.free_queue) // 4)
        for block in self.pool.free_queue:  # head first: the next to be evicted
            if len(chosen) >= limit:
                break
            if wanted(block):
                chosen.append(block)
        if not chosen:
            return []
        self.pool.touch(chosen)
        return [self._entry(b) for b in chosen]

    def begin_import(
        self,
        prompt: list[int],
        cache_salt: bytes,
        hashes: list[BlockHash],
        first_block: int,
        num_blocks: int,
    ) -> PrefixImport | None:
        """Reserves fresh blocks for prompt blocks ``first_block .. first_block+num_blocks-1``
        (fewer if the prompt has fewer reusable blocks); None when the pool has no room (the
        caller then just computes). ``hashes`` are ``prompt_hashes(prompt, cache_salt)``."""
        wanted = hashes[first_block : first_block + num_blocks]
        if first_block < 0 or not wanted:
            return None
        kept = [self.pool.get_cached_block(h) for h in hashes[: self.num_leading_cached(hashes)]]
        protected = [b for b in kept if b is not None]
        self.pool.touch(protected)
        fresh = self.pool.allocate(len(wanted))
        if fresh is None:
            self.pool.free(protected)
            return None
        root, bs = self._root(cache_salt), self.block_size
        indices = range(first_block, first_block + len(wanted))
        return PrefixImport(
            first_block=first_block,
            block_ids=[b.block_id for b in fresh],
            block_hashes=wanted,
            parent_hashes=[hashes[i - 1] if i else root for i in indices],
            token_ids=[prompt[i * bs : (i + 1) * bs] for i in indices],
            fresh=fresh,
            protected=protected,
            quota_key=quota_key(cache_salt),
        )

    def finish_import(self, imp: PrefixImport, checksums: list[int]) -> int:
        """Caches the first ``len(checksums)`` imported blocks (verified by the caller, in
        chain order) and releases everything the import held; returns how many it cached."""
        cached = 0
        for i, checksum in enumerate(checksums[: len(imp.fresh)]):
            block = imp.fresh[i]
            args = (imp.block_hashes[i], imp.parent_hashes[i], imp.token_ids[i], imp.quota_key)
            # False: the same block got cached here meanwhile; this copy goes back unused.
            if self.pool.cache_block(block, *args, sunk=imp.sunk):
                block.checksum = checksum
                cached += 1
        self.pool.free(imp.fresh)
        self.pool.free(imp.protected)
        return cached

    def _entry(self, block: KVBlock) -> CachedBlock:
        assert block.block_hash is not None and block.parent_hash is not None
        if block.checksum is None:
            block.checksum = self._checksum(block.block_id)
        return CachedBlock(
            block.block_id,
            block.block_hash,
            block.parent_hash,
            block.token_ids,
            block.checksum,
            block.quota_key,
        )
