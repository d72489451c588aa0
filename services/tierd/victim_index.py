"""The blocks a tier may evict, kept in order: the metadata a policy sees of each block, and an
index of the blocks with no held child ordered by a policy's rank. Pure data structures (no
I/O, no framework), shared by tierd's policies and the simulator's pool.

Ties go to the deeper block, then to the lower hash, so every order is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

Rank = tuple[float, ...]
_Entry = tuple[Rank, int, bytes]  # (rank, -depth, hash): the heap's order
# Stale entries are dropped in one pass once they outnumber the live ones by this much.
_COMPACT_SLACK = 1024


@dataclass(slots=True)
class BlockInfo:
    """What a policy knows of one block held in a tier."""

    block_hash: bytes
    parent_hash: bytes
    num_bytes: int
    depth: int  # blocks before it in its chain (0: the chain's first block)
    created_at: float
    last_access: float
    access_count: int
    quota_key: bytes = b""


class VictimIndex:
    """Owns a set of held blocks and the order they would be evicted in.

    A block is evictable when no held block has it as parent, so chains are cut from the tail
    and a held block's whole prefix stays held; evictable blocks come out lowest ``rank`` first.

    Invariant: every evictable block that ``eligible`` accepts has exactly one live entry in the
    heap, the one ``_live`` records; any other entry is stale and skipped when it surfaces (lazy
    deletion). ``rank`` must give a block the same value until ``update`` is called for it (a
    rank that does not move with the clock): then the order is that of a full re-sort.
    """

    def __init__(
        self,
        rank: Callable[[BlockInfo], Rank],
        blocks: Mapping[bytes, BlockInfo] | None = None,
        eligible: Callable[[BlockInfo], bool] | None = None,
    ) -> None:
        self._rank = rank
        self._eligible = eligible
        self._blocks: dict[bytes, BlockInfo] = dict(blocks) if blocks else {}
        # Held children per parent hash, whether or not the parent itself is held.
        self._children: dict[bytes, int] = {}
        for block_hash, info in self._blocks.items():
            parent = info.parent_hash
            if parent != block_hash:
                self._children[parent] = self._children.get(parent, 0) + 1
        self._live: dict[bytes, _Entry] = {}
        for block_hash, info in self._blocks.items():
            if block_hash not in self._children:
                self._mark(info)
        self._heap: list[_Entry] = list(self._live.values())
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def get(self, block_hash: bytes) -> BlockInfo | None:
        return self._blocks.get(block_hash)

    @property
    def blocks(self) -> Mapping[bytes, BlockInfo]:
        """The held blocks, read-only."""
        return MappingProxyType(self._blocks)

    def evictable(self, block_hash: bytes) -> bool:
        """Whether the block is held and no held block has it as parent."""
        return block_hash in self._blocks and block_hash not in self._children

    def add(self, info: BlockInfo) -> None:
        """Holds a new block; its parent, if held, stops being evictable. ValueError if held."""
        block_hash = info.block_hash
        if block_hash in self._blocks:
            raise ValueError(f"block {block_hash.hex()} is already held")
        self._blocks[block_hash] = info
        parent = info.parent_hash
        if parent != block_hash:
            self._children[parent] = self._children.get(parent, 0) + 1
            self._live.pop(parent, None)
        if block_hash not in self._children:
            self._push(info)

    def update(self, block_hash: bytes) -> None:
        """Ranks the block again after its metadata changed in place (a read, say)."""
        info = self._blocks[block_hash]
        if block_hash not in self._children:
            self._push(info)

    def rerank(self) -> None:
        """Ranks every evictable block again, for a rank whose parameters changed."""
        self._live.clear()
        for block_hash, info in self._blocks.items():
            if block_hash not in self._children:
                self._mark(info)
        self._heap = list(self._live.values())
        heapq.heapify(self._heap)

    def remove(self, block_hash: bytes) -> BlockInfo:
        """Forgets a held block (KeyError if not held); a parent left with no held child becomes
        evictable. Dropping a block that leads to held ones leaves them with no held parent."""
        info = self._blocks.pop(block_hash)
        self._live.pop(block_hash, None)
        parent = info.parent_hash
        if parent != block_hash:
            left = self._children[parent] - 1
            if left:
                self._children[parent] = left
            else:
                del self._children[parent]
                parent_info = self._blocks.get(parent)
                if parent_info is not None:
                    self._push(parent_info)
        return info

    def peek(self) -> BlockInfo | None:
        """The next victim, left in place; None when no eligible block is evictable."""
        heap = self._heap
        while heap:
            entry = heap[0]
            if self._live.get(entry[2]) is entry:
                return self._blocks[entry[2]]
            heapq.heappop(heap)
        return None

    def pop(self) -> BlockInfo | None:
        """Removes and returns the next victim; None when no eligible block is evictable."""
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            if self._live.get(entry[2]) is entry:
                return self.remove(entry[2])
        return None

    def _mark(self, info: BlockInfo) -> _Entry | None:
        if self._eligible is not None and not self._eligible(info):
            return None
        entry = (self._rank(info), -info.depth, info.block_hash)
        self._live[info.block_hash] = entry
        return entry

    def _push(self, info: BlockInfo) -> None:
        entry = self._mark(info)
        if entry is None:
            return
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._live) + _COMPACT_SLACK:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)


def tail_first_victims(
    blocks: Mapping[bytes, BlockInfo],
    need_bytes: int,
    rank: Callable[[BlockInfo], Rank],
    quota_key: bytes | None = None,
) -> list[bytes]:
    """The lowest-ranked evictable blocks until ``need_bytes`` are freed (only those of
    ``quota_key`` when given): a parent joins the candidates once its last child is chosen.
    Each block is ranked once, when it becomes a candidate."""
    if need_bytes <= 0:
        return []
    eligible = None if quota_key is None else (lambda info: info.quota_key == quota_key)
    index = VictimIndex(rank, blocks, eligible)
    chosen: list[bytes] = []
    freed = 0
    while freed < need_bytes:
        victim = index.pop()
        if victim is None:
            break
        chosen.append(victim.block_hash)
        freed += victim.num_bytes
    return chosen
