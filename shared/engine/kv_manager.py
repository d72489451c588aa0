"""Gives sequences KV blocks from the pool: prefix-cache hits first, fresh blocks for the rest."""

from __future__ import annotations

from collections.abc import Callable

from shared.engine.partial_blocks import PartialBlocks, PartialHit, common_prefix
from shared.engine.sequence import Sequence
from shared.kv.hashing import BlockHash, extend_block_hashes
from shared.kv.pool import BlockPool, KVBlock


class KVCacheManager:
    """Owns the mapping of sequences to pool blocks; the pool owns the blocks themselves.

    A block becomes shareable (gets its hash in the pool) only once all of its tokens are
    computed, so a hit never returns a block whose KV is still being written. A finished
    sequence's partly filled last block is remembered in ``partials`` (never shared: one later
    sequence may take its slot back); the leading tokens of a cached full block are reused
    through a copy (``copy_block(src, dst)`` copies a block's KV; None: no partial reuse).
    """

    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        enable_prefix_caching: bool = True,
        copy_block: Callable[[int, int], None] | None = None,
    ):
        self.pool = pool
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.copy_block = copy_block
        self.partials = PartialBlocks()

    def find_cached_prefix(self, seq: Sequence) -> list[KVBlock]:
        """The longest run of the sequence's leading full blocks present in the pool.

        The last token is never taken from the cache: its logits are needed to sample the
        next token, so at least one token is always computed.
        """
        if not self.enable_prefix_caching or not seq.params.cache_read:
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

    def find_partial_block(self, seq: Sequence, num_full_hits: int) -> PartialHit | None:
        """The block holding the most of the sequence's next tokens after its
        ``num_full_hits`` leading cached blocks (never its last token, whose logits are
        needed): a remembered partial block, or a cached full block whose first tokens they
        are; None when none holds any."""
        if not self.enable_prefix_caching or self.copy_block is None or not seq.params.cache_read:
            return None
        start = num_full_hits * self.block_size
        limit = min(seq.num_tokens - 1 - start, self.block_size - 1)
        if limit <= 0:
            return None
        parent = seq.block_hashes[num_full_hits - 1] if num_full_hits else seq.root_hash
        wanted = seq.token_ids[start : start + limit]
        best = self.partials.find(parent, wanted, limit)
        for block in self.pool.cached_children(parent):
            shared = common_prefix(block.token_ids, wanted, limit)
            if shared and (best is None or shared > best.num_tokens):
                best = PartialHit(block, shared)
        return best

    def allocate(
        self,
        seq: Sequence,
        num_new_tokens: int,
        cached: list[KVBlock] | None = None,
        partial: PartialHit | None = None,
    ) -> bool:
        """Makes room for ``num_new_tokens`` more computed tokens; False (and no change) if the
        pool cannot supply the blocks. ``cached`` are prefix hits to take a reference on, and
        ``partial`` the block after them whose leading tokens are reused
        (``find_partial_block``)."""
        cached = cached or []
        total_tokens = seq.num_computed_tokens + num_new_tokens
        num_needed = -(-total_tokens // self.block_size) - len(seq.block_table) - len(cached)
        # A hit on an unreferenced cached block takes it out of the free queue too. A partial
        # block taken back is one of the blocks needed; an unreferenced one copied is held
        # (out of the queue) while its copy is made.
        num_revived = sum(1 for b in cached if b.ref_cnt == 0)
        if partial is not None and partial.entry is None and partial.source.ref_cnt == 0:
            num_revived += 1
        if max(num_needed, 0) + num_revived > self.pool.num_free_blocks:
            return False
        self.pool.touch(cached)
        seq.block_table.extend(cached)
        if partial is not None:
            seq.block_table.append(self._reuse(partial))
            num_needed -= 1
        if num_needed > 0:
            fresh = self.pool.allocate(num_needed)
            assert fresh is not None, "free-block count checked above"
            seq.block_table.extend(fresh)
        return True

    def _reuse(self, partial: PartialHit) -> KVBlock:
        """The block a sequence continues in: a remembered partial block taken back, or a
        fresh copy of a cached one (held while it is copied, so nothing can evict it)."""
        if partial.entry is not None:
            block = self.partials.take(partial.entry)
            self.pool.touch([block])
            return block
        assert self.copy_block is not None  # find_partial_block found no copy otherwise
        source = partial.source
        self.pool.touch([source])
        fresh = self.pool.allocate(1)
        assert fresh is not None, "free-block count checked by allocate"
        self.copy_block(source.block_id, fresh[0].block_id)
        self.pool.free([source])
        return fresh[0]

    def cache_computed_blocks(self, seq: Sequence, *, computed_here: bool = True) -> None:
        """Publishes every block that is now full of computed tokens under its chained hash.
        The blocks it newly caches count as the sequence's writes (``num_*_tokens_written``)
        unless their KV was computed elsewhere (``computed_here`` False: an import)."""
        num_full = seq.num_computed_tokens // self.block_size
        if not self.enable_prefix_caching or num_full <= seq.num_published_blocks:
            return
        if not seq.params.cache_write:
            return  # its blocks stay private and go back to the pool when it ends
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
                args = (seq.block_hashes[i], parent, tokens, seq.quota_key)
                if self.pool.cache_block(block, *args) and computed_here:
                    in_prompt = min(max(seq.num_prompt_tokens - i * bs, 0), bs)
                    seq.num_prompt_tokens_written += in_prompt
                    seq.num_output_tokens_written += bs - in_prompt
        seq.num_published_blocks = num_full

    def prompt_block_hashes(self, seq: Sequence) -> list[BlockHash]:
        """The hashes of the prompt's full blocks (what a keep applies to)."""
        num_full = seq.num_prompt_tokens // self.block_size
        if len(seq.block_hashes) < num_full:
            self._hash_full_blocks(seq, num_full * self.block_size)
        return seq.block_hashes[:num_full]

    def free(self, seq: Sequence) -> None:
        partial = self._partial_block(seq)
        self.pool.free(seq.block_table)
        if partial is not None:
            self.partials.remember(*partial)
        seq.block_table = []
        seq.num_published_blocks = 0

    def _partial_block(self, seq: Sequence) -> tuple[BlockHash, KVBlock, tuple[int, ...]] | None:
        """The sequence's partly computed last block, if it is its own (not cached, no other
        holder): its chain parent, the slot, and the tokens whose KV the slot holds."""
        if not self.enable_prefix_caching or not seq.params.cache_write:
            return None
        full, used = divmod(seq.num_computed_tokens, self.block_size)
        if used == 0 or full >= len(seq.block_table):
            return None
        block = seq.block_table[full]
        if block.block_hash is not None or block.ref_cnt != 1:
            return None
        if len(seq.block_hashes) < full:
            self._hash_full_blocks(seq, full * self.block_size)
        parent = seq.block_hashes[full - 1] if full else seq.root_hash
        start = full * self.block_size
        return parent, block, tuple(seq.token_ids[start : start + used])

    def _hash_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        extend_block_hashes(
            seq.block_hashes, seq.token_ids[:num_tokens], self.block_size, seq.root_hash
        )
