"""The blocks a tier may evict, kept in order: the metadata a policy sees of each block, and an
index of the blocks with no held child ordered by a policy's rank. Pure data structures (no
I/O, no framework), shared by tierd's policies and the simulator's pool.

Ties go to the deeper block, then to the lower hash, so every order is deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
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

    Blocks are ranked when the order is next read (``peek``, ``pop``), not as they change: a
    block stored or read is mostly a chain's tail that the next block of the chain holds back
    at once, and a tier that seldom evicts seldom ranks. Invariant: every evictable block that
    ``eligible`` accepts either has exactly one live entry in the heap, the one ``_live``
    records, or has no entry in ``_live`` and is listed in ``_unranked``; any other heap entry
    is stale and skipped when it surfaces (lazy deletion). ``_unranked`` may also list blocks
    no longer held or evictable, and a block more than once: ranking skips those. ``rank`` must
    give a block the same value until ``update`` is called for it (a rank that does not move
    with the clock): then the order is that of a full re-sort.
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
        self._heap: list[_Entry] = []
        self._unranked: list[BlockInfo] = []
        self.rerank()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def get(self, block_hash: bytes) -> BlockInfo | None:
        return self._blocks.get(block_hash)

    @property
    def blocks(self) -> Mapping[bytes, BlockInfo]:
        """The held blocks, read-only (a live view: it follows every change)."""
        return MappingProxyType(self._blocks)

    def evictable(self, block_hash: bytes) -> bool:
        """Whether the block is held and no held block has it as parent."""
        return block_hash in self._blocks and block_hash not in self._children

    def add(self, info: BlockInfo) -> None:
        """Holds a new block; its parent, if held, stops being evictable. ValueError if held."""
        self._hold(info)
        self._list_unranked(info)

    def add_all(self, infos: Iterable[BlockInfo]) -> None:
        """``add`` of each of ``infos`` in turn, listing for ranking only the blocks still
        evictable after the last (a chain's tail, not each block of it)."""
        added = list(infos)
        for info in added:
            self._hold(info)
        children = self._children
        for info in added:
            if info.block_hash not in children:
                self._list_unranked(info)

    def _hold(self, info: BlockInfo) -> None:
        block_hash = info.block_hash
        blocks = self._blocks
        if block_hash in blocks:
            raise ValueError(f"block {block_hash.hex()} is already held")
        blocks[block_hash] = info
        parent = info.parent_hash
        if parent != block_hash:
            children = self._children
            children[parent] = children.get(parent, 0) + 1
            if self._live:
                self._live.pop(parent, None)

    def update(self, block_hash: bytes) -> None:
        """Ranks the block again after its metadata changed in place (a read, say)."""
        info = self._blocks[block_hash]
        if block_hash not in self._children:
            self._live.pop(block_hash, None)
            self._list_unranked(info)

    def rerank(self) -> None:
        """Ranks every evictable block again, for a rank whose parameters changed."""
        self._live.clear()
        self._heap = []
        children = self._children
        self._unranked = [info for h, info in self._blocks.items() if h not in children]

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
                    self._list_unranked(parent_info)
        return info

    def peek(self) -> BlockInfo | None:
        """The next victim, left in place; None when no eligible block is evictable."""
        self._rank_unranked()
        heap = self._heap
        while heap:
            entry = heap[0]
            if self._live.get(entry[2]) is entry:
                return self._blocks[entry[2]]
            heapq.heappop(heap)
        return None

    def pop(self) -> BlockInfo | None:
        """Removes and returns the next victim; None when no eligible block is evictable."""
        if self._unranked:
            self._rank_unranked()
        heap, live = self._heap, self._live
        while heap:
            entry = heapq.heappop(heap)
            if live.get(entry[2]) is entry:
                return self.remove(entry[2])
        return None

    def _list_unranked(self, info: BlockInfo) -> None:
        unranked = self._unranked
        unranked.append(info)
        # A tier that never reads its order would list every block it ever stored.
        if len(unranked) > 2 * len(self._blocks) + _COMPACT_SLACK:
            self._rank_unranked()

    def _rank_unranked(self) -> None:
        """Gives every evictable block listed in ``_unranked`` its live entry."""
        unranked = self._unranked
        if not unranked:
            return
        self._unranked = []
        rank, eligible = self._rank, self._eligible
        blocks, children, live = self._blocks, self._children, self._live
        entries = []
        for info in unranked:
            block_hash = info.block_hash
            # Listed again since, no longer held (or held anew as another object), or holding
            # a child back: nothing to rank.
            if block_hash in live or block_hash in children or blocks.get(block_hash) is not info:
                continue
            if eligible is None or eligible(info):
                entry = (rank(info), -info.depth, block_hash)
                live[block_hash] = entry
                entries.append(entry)
        heap = self._heap
        if len(entries) == 1 and len(heap) <= 2 * len(live) + _COMPACT_SLACK:
            heapq.heappush(heap, entries[0])  # the common case: a victim's parent comes up
        elif len(heap) + len(entries) > 2 * len(live) + _COMPACT_SLACK or len(entries) > len(heap):
            # Many new entries, or mostly stale ones: one heapify of the live ones is cheaper.
            self._heap = list(live.values())
            heapq.heapify(self._heap)
        else:
            for entry in entries:
                heapq.heappush(heap, entry)


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
