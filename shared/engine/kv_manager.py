"""Gives sequences KV blocks from the pool: prefix-cache hits first, fresh blocks for the rest."""

from __future__ import annotations

from shared.engine.sequence import Sequence
from shared.kv.hashing import extend_block_hashes
from shared.kv.pool import BlockPool, KVBlock


class KVCacheManager:
    """Owns the mapping of sequences to pool blocks; the pool owns the blocks themselves.

    A block becomes shareable (gets its hash in the pool) only once all of its tokens are
    computed, so a hit never returns a block whose KV is still being written.
    """

    def __init__(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool = True):
        self.pool = pool
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching

    def find_cached_prefix(self, seq: Sequence) -> list[KVBlock]:
        """The longest run of the sequence's leading full blocks present in the pool.

        The last token is never taken from the cache: its logits are needed to sample the
        next token, so at least one token is always computed.
        """
        if not self.enable_prefix_caching:
            return []
        self._hash_full_blocks(seq, seq.num_tokens)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in seq.block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate(
        self, seq: Sequence, num_new_tokens: int, cached: list[KVBlock] | None = None
    ) -> bool:
        """Makes room for ``num_new_tokens`` more computed tokens; False (and no change) if the
        pool cannot supply the blocks. ``cached`` are prefix hits to take a reference on."""
        cached = cached or []
        total_tokens = seq.num_computed_tokens + num_new_tokens
        num_needed = -(-total_tokens // self.block_size) - len(seq.block_table) - len(cached)
        # A hit on an unreferenced cached block takes it out of the free queue too.
        num_revived = sum(1 for b in cached if b.ref_cnt == 0)
        if max(num_needed, 0) + num_revived > self.pool.num_free_blocks:
            return False
        self.pool.touch(cached)
        seq.block_table.extend(cached)
        if num_needed > 0:
            fresh = self.pool.allocate(num_needed)
            assert fresh is not None, "free-block count checked above"
            seq.block_table.extend(fresh)
        return True

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Publishes every block that is now full of computed tokens under its chained hash."""
        num_full = seq.num_computed_tokens // self.block_size
        if not self.enable_prefix_caching or num_full <= seq.num_published_blocks:
            return
        if len(seq.block_hashes) < num_full:
            self._hash_full_blocks(seq, num_full * self.block_size)
        bs = self.block_size
        for i in range(seq.num_published_blocks, num_full):
            block = seq.block_table[i]
            if block.block_hash is None:
                # False means another sequence published the same tokens first; this copy
                # simply stays private and returns to the pool when the sequence ends.
                parent = seq.block_hashes[i - 1] if i else seq.root_hash
                tokens = seq.token_ids[i * bs : (i + 1) * bs]
                self.pool.cache_block(block, seq.block_hashes[i], parent, tokens, seq.quota_key)
        seq.num_published_blocks = num_full

    def free(self, seq: Sequence) -> None:
        self.pool.free(seq.block_table)
        seq.block_table = []
        seq.num_published_blocks = 0

    def _hash_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        extend_block_hashes(
            seq.block_hashes, seq.token_ids[:num_tokens], self.block_size, seq.root_hash
        )
