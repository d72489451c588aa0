"""A fixed pool of preallocated KV block slots with reference counts and a prefix cache.

The pool only does bookkeeping: which slot ids are in use, how many sequences share each one,
and which full blocks may be reused by content hash. The bytes live wherever the caller keeps
them, indexed by ``block_id``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from shared.kv.hashing import HASH_BYTES, BlockHash


@dataclass(slots=True, eq=False)
class KVBlock:
    """Bookkeeping of one block slot.

    Owns the slot's reference count, its content hash while it is a cached full block, and
    its links in the free queue. Invariant: ``prev_free``/``next_free`` are set iff the block is
    in a free queue; identity (not value) equality, so blocks can key dicts and sets.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    # What the catalogue records of a cached block; set with its hash, cleared on eviction.
    parent_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()
    checksum: int | None = None  # of its bytes; computed lazily, once, by whoever needs it
    # The tenant scope whose lower-tier quota the block counts against (``quota_key``).
    quota_key: bytes = b""
    # A lower tier (tierd) holds a copy: evicting it here loses nothing.
    sunk: bool = False
    # Counts the times the pool handed the slot out: whoever remembers what an unreferenced
    # slot holds (``KVCacheManager``'s partial blocks) can tell it was overwritten since.
    generation: int = 0
    # The links point at neighbours; keeping them out of repr avoids printing the whole queue.
    prev_free: KVBlock | None = field(default=None, repr=False)
    next_free: KVBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    """Doubly linked list of unreferenced blocks in eviction order (head = evicted first).

    Owns the ``prev_free``/``next_free`` links of the blocks it holds. O(1) popleft, append and
    remove. Invariant: a block is in the queue iff its ``prev_free`` is set (sentinels at both
    ends mean every member has both neighbours, so no operation needs an empty-list branch).
    """

    __slots__ = ("_head", "_len", "_tail")

    def __init__(self, blocks: Iterable[KVBlock] = ()) -> None:
        self._head = KVBlock(block_id=-1)
        self._tail = KVBlock(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __contains__(self, block: KVBlock) -> bool:
        return block.prev_free is not None

    def popleft(self) -> KVBlock:
        """Removes and returns the block that should be evicted first."""
        first = self._head.next_free
        if first is self._tail or first is None:
            raise IndexError("popleft from an empty FreeBlockQueue")
        self._unlink(first)
        return first

    def append(self, block: KVBlock) -> None:
        """Puts ``block`` at the tail: it will be evicted last."""
        if block.prev_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free
        assert last is not None
        block.prev_free = last
        block.next_free = self._tail
        last.next_free = block
        self._tail.prev_free = block
        self._len += 1

    def remove(self, block: KVBlock) -> None:
        """Takes ``block`` out of the queue wherever it is."""
        if block.prev_free is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        self._unlink(block)

    def _unlink(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def __iter__(self) -> Iterator[KVBlock]:
        node = self._head.next_free
        while node is not None and node is not self._tail:
            yield node
            node = node.next_free


class BlockPool:
    """A fixed set of KV block slots, shared between sequences by reference counting.

    Owns ``num_blocks`` block slots with ids ``0..num_blocks-1`` (``blocks[i].block_id == i``),
    their ref counts, the map block_hash -> cached block, the LRU free queue, and the
    stored/evicted events not yet drained.

    Invariants: a block is in the free queue iff ``ref_cnt == 0``; a block with a hash is in the
    hash map under that hash, and under its ``parent_hash`` among the children when it has
    one; a hash maps to at most one block; ``num_unsunk`` counts the cached blocks whose
    ``sunk`` is False.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"a BlockPool needs at least one block, got num_blocks={num_blocks}")
        self.num_blocks = num_blocks
        self.blocks: list[KVBlock] = [KVBlock(block_id=i) for i in range(num_blocks)]
        # Callers may iterate it; only the pool mutates it.
        self.free_queue = FreeBlockQueue(self.blocks)
        self._cached: dict[BlockHash, KVBlock] = {}
        # Cached blocks by the hash of the block before them in their chain (where known).
        self._children: dict[BlockHash, list[KVBlock]] = {}
        # Dicts as ordered sets: a hash stored and evicted within one drain window nets out.
        self._stored: dict[BlockHash, None] = {}
        self._evicted: dict[BlockHash, None] = {}
        self.num_unsunk = 0
        self.num_evicted = 0  # cached blocks taken for new ones since start

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ``ref_cnt == 0``, including cached ones (they are reusable)."""
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that currently carry a hash."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by at least one sequence."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        """The block cached under ``block_hash``, referenced or not; None on a miss."""
        return self._cached.get(block_hash)

    def cached_children(self, parent_hash: BlockHash) -> list[KVBlock]:
        """The cached blocks that follow ``parent_hash`` in their chains (read only)."""
        return self._children.get(parent_hash, [])

    def allocate(self, num: int) -> list[KVBlock] | None:
        """Takes ``num`` blocks from the head of the free queue, each with ``ref_cnt == 1``.

        A taken block that was cached loses its hash (an eviction). Returns None and changes
        nothing when fewer than ``num`` blocks are free: running out is normal under load.
        """
        if num < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({num})")
        if num > len(self.free_queue):
            return None
        taken: list[KVBlock] = []
        for _ in range(num):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            block.generation += 1
            taken.append(block)
        return taken

    def touch(self, blocks: Sequence[KVBlock]) -> None:
        """Adds a reference to each block; an unreferenced one leaves the free queue.

        This is how a prefix-cache hit claims a cached block before anything can evict it.
        """
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free(self, blocks: Sequence[KVBlock]) -> None:
        """Drops one reference from each block; blocks reaching zero become evictable.

        They join the free-queue tail in reverse order of ``blocks``: a sequence lists its blocks
        from the first, so its deepest (least shared) blocks are evicted before the common
        prefix. Raises ValueError, changing nothing, if a block has no reference left to drop.
        """
        self._release_refs(blocks)
        for block in reversed(blocks):
            # A block listed twice must be queued once.
            if block.ref_cnt == 0 and block not in self.free_queue:
                self.free_queue.append(block)

    def _release_refs(self, blocks: Sequence[KVBlock]) -> None:
        for done, block in enumerate(blocks):
            if block.ref_cnt <= 0:
                for undo in blocks[:done]:
                    undo.ref_cnt += 1
                raise ValueError(f"block {block.block_id} is freed more times than it is held")
            block.ref_cnt -= 1

    def cache_block(
        self,
        block: KVBlock,
        block_hash: BlockHash,
        parent_hash: BlockHash | None = None,
        token_ids: Sequence[int] = (),
        quota_key: bytes = b"",
        *,
        sunk: bool = False,
    ) -> bool:
        """Makes a full block reusable under ``block_hash`` (whose chain parent and tokens
        are recorded for the catalogue, and the tenant scope it counts against below DRAM);
        ``sunk`` says a lower tier already holds it (it was read up from there).

        Returns True if the block is now cached under that hash (newly or already), False if the
        hash already belongs to another block (this one stays uncached; the caller may keep using
        it privately). Raises ValueError if the block is cached under a different hash.
        """
        if len(block_hash) != HASH_BYTES:
            raise ValueError(f"a block hash is {HASH_BYTES} bytes, got {len(block_hash)}")
        if block.block_hash is not None:
            if block.block_hash != block_hash:
                raise ValueError(
                    f"block {block.block_id} is already cached under {block.block_hash.hex()}"
                )
            return True
        if block_hash in self._cached:
            return False
        block.block_hash = block_hash
        block.parent_hash = parent_hash
        block.token_ids = tuple(token_ids)
        block.checksum = None
        block.quota_key = quota_key
        block.sunk = sunk
        self.num_unsunk += not sunk
        self._cached[block_hash] = block
        if parent_hash is not None:
            self._children.setdefault(parent_hash, []).append(block)
        self._evicted.pop(block_hash, None)
        self._stored[block_hash] = None
        return True

    def _evict(self, block: KVBlock) -> None:
        block_hash = block.block_hash
        assert block_hash is not None
        del self._cached[block_hash]
        self.num_evicted += 1
        if block.parent_hash is not None:
            siblings = self._children[block.parent_hash]
            siblings.remove(block)
            if not siblings:
                del self._children[block.parent_hash]
        block.block_hash = None
        block.parent_hash = None
        block.token_ids = ()
        block.checksum = None
        block.quota_key = b""
        self.num_unsunk -= not block.sunk
        block.sunk = False
        self._stored.pop(block_hash, None)
        # Re-inserting keeps the list in order of the latest eviction.
        self._evicted.pop(block_hash, None)
        self._evicted[block_hash] = None

    def mark_sunk(self, block_hashes: Iterable[BlockHash]) -> int:
        """Records that a lower tier holds these blocks; returns how many changed."""
        marked = 0
        for block_hash in block_hashes:
            block = self._cached.get(block_hash)
            if block is not None and not block.sunk:
                block.sunk = True
                marked += 1
        self.num_unsunk -= marked
        return marked

    def forget_sunk(self) -> None:
        """Every cached block counts as held nowhere else again (the lower tier was lost)."""
        for block in self._cached.values():
            block.sunk = False
        self.num_unsunk = len(self._cached)

    def cached_blocks(self) -> list[KVBlock]:
        """Every block that carries a hash, referenced or not."""
        return list(self._cached.values())

    def drain_events(self) -> tuple[list[BlockHash], list[BlockHash]]:
        """``(stored, evicted)`` hashes since the last drain, each in event order.

        Events are netted per hash: a hash appears in at most one list, the one matching its
        latest event, so applying both lists in either order leaves a catalogue in sync.
        """
        stored, evicted = list(self._stored), list(self._evicted)
        self._stored.clear()
        self._evicted.clear()
        return stored, evicted

    def reset_prefix_cache(self) -> int:
        """Drops the hashes of all unreferenced cached blocks; returns how many were dropped.

        Referenced blocks keep their hashes: a running sequence may still be reading them.
        """
        dropped = 0
        for block in self.free_queue:
            if block.block_hash is not None:
                self._evict(block)
                dropped += 1
        return dropped
