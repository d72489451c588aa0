"""The in-memory prefix index: which holders (node, tier) hold which blocks.

Pure data structure, no I/O. Each holder gets a small integer id and each block a bit mask of
its holders, so matching a chain is one dict lookup and one AND per block.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from operator import itemgetter

from shared.kv.tiers import LOWER_TIERS, S3
from shared.rpc.types import PrefixHolder

Holder = tuple[str, str]  # (node_id, tier)
_num_blocks = itemgetter(2)


class PrefixIndex:
    """Owns the map block hash -> holders, each block's size, and each holder's block hashes.

    Invariants: ``block_hash`` is in ``_masks`` and ``_sizes`` iff at least one holder holds
    it; bit ``i`` of ``_masks[h]`` is set iff ``h`` is in ``_blocks[i]``; a holder id is
    allocated iff the holder holds at least one block (ids are reused once freed);
    ``replica_bytes`` is the sum of the sizes of every holder's blocks; bit ``i`` of
    ``_tier_masks[t]`` is set iff holder ``i`` is allocated and its tier is ``t``.
    """

    def __init__(self) -> None:
        self._masks: dict[bytes, int] = {}
        self._sizes: dict[bytes, int] = {}
        self._ids: dict[Holder, int] = {}
        self._holders: dict[int, Holder] = {}
        self._blocks: dict[int, set[bytes]] = {}
        self._free_ids: list[int] = []
        self._tier_masks: dict[str, int] = {}  # tier -> bits of the holders in that tier
        self.replica_bytes = 0

    def __len__(self) -> int:
        """The number of distinct blocks held anywhere."""
        return len(self._masks)

    @property
    def num_replicas(self) -> int:
        return sum(len(blocks) for blocks in self._blocks.values())

    def add(self, holder: Holder, block_hashes: Iterable[bytes], sizes: Mapping[bytes, int]) -> int:
        """Records that ``holder`` holds these blocks; returns how many it did not hold before.
        ``sizes`` gives the byte size of every block not in the index yet (a block keeps the
        size it was first added with)."""
        holder_id = self._ids.get(holder)
        if holder_id is None:
            holder_id = self._free_ids.pop() if self._free_ids else len(self._ids)
            self._ids[holder] = holder_id
            self._holders[holder_id] = holder
            self._blocks[holder_id] = set()
            tier = holder[1]
            self._tier_masks[tier] = self._tier_masks.get(tier, 0) | 1 << holder_id
        held = self._blocks[holder_id]
        bit = 1 << holder_id
        masks, known = self._masks, self._sizes
        before = len(held)
        added_bytes = 0
        for block_hash in block_hashes:  # the hot loop of a reload: keep it plain
            if block_hash in held:
                continue
            held.add(block_hash)
            mask = masks.get(block_hash)
            if mask is None:
                masks[block_hash] = bit
                size = known[block_hash] = sizes[block_hash]
            else:
                masks[block_hash] = mask | bit
                size = known[block_hash]
            added_bytes += size
        self.replica_bytes += added_bytes
        if not held:
            self._release(holder)
        return len(held) - before

    def remove(self, holder: Holder, block_hashes: Iterable[bytes]) -> int:
        """Forgets these blocks of ``holder``; returns how many it held."""
        holder_id = self._ids.get(holder)
        if holder_id is None:
            return 0
        held = self._blocks[holder_id]
        gone = held.intersection(block_hashes)
        held -= gone
        for block_hash in gone:
            self._clear_bit(block_hash, holder_id)
        if not held:
            self._release(holder)
        return len(gone)

    def remove_holder(self, holder: Holder) -> int:
        """Forgets everything ``holder`` holds; returns how many blocks that was."""
        holder_id = self._ids.get(holder)
        if holder_id is None:
            return 0
        held = self._blocks[holder_id]
        for block_hash in held:
            self._clear_bit(block_hash, holder_id)
        count = len(held)
        self._release(holder)
        return count

    def remove_node(self, node_id: str) -> int:
        """Forgets everything ``node_id`` holds in any tier; returns the number of replicas."""
        return sum(self.remove_holder(h) for h in self.holders_of(node_id))

    def holders_of(self, node_id: str) -> list[Holder]:
        return [h for h in self._ids if h[0] == node_id]

    def blocks_of(self, holder: Holder) -> frozenset[bytes]:
        holder_id = self._ids.get(holder)
        return frozenset(self._blocks[holder_id]) if holder_id is not None else frozenset()

    def holds(self, holder: Holder, block_hash: bytes) -> bool:
        holder_id = self._ids.get(holder)
        return holder_id is not None and block_hash in self._blocks[holder_id]

    def contains(self, block_hash: bytes) -> bool:
        return block_hash in self._masks

    def replica_counts(self) -> dict[str, int]:
        """Replicas per node, every tier together."""
        counts: dict[str, int] = {}
        for holder_id, blocks in self._blocks.items():
            node_id = self._holders[holder_id][0]
            counts[node_id] = counts.get(node_id, 0) + len(blocks)
        return counts

    def match(self, chain: Sequence[bytes], tiers: Collection[str] = ()) -> list[PrefixHolder]:
        """Per holder, how many leading blocks of ``chain`` it holds; longest first (ties by
        node then tier), holders of no leading block left out; only holders in ``tiers``
        unless it is empty.

        A node's NVMe and S3 count as one where that goes further: a tierd reads each block
        from whichever of its tiers holds it, and cold-first tiering leaves a chain split
        between them (its head in S3, its tail in NVMe, say). Its ``s3`` entry then counts the
        leading blocks it holds in either, priced as the slower tier."""
        return [PrefixHolder(n, t, k) for n, t, k in self.match_counts(chain, tiers)]

    def match_counts(
        self, chain: Sequence[bytes], tiers: Collection[str] = ()
    ) -> list[tuple[str, str, int]]:
        """``match`` as plain ``(node_id, tier, num_blocks)`` tuples: the servicer's fast path
        (a reply may list every holder, and dataclasses cost more than the matching)."""
        masks = self._masks
        alive = masks.get(chain[0], 0) if chain else 0
        if tiers:
            wanted = 0
            for tier in tiers:
                wanted |= self._tier_masks.get(tier, 0)
            alive &= wanted
        found: list[tuple[str, str, int]] = []
        position = 1
        while alive and position < len(chain):
            still = alive & masks.get(chain[position], 0)
            if still != alive:
                self._collect(alive & ~still, position, found)
                alive = still
            position += 1
        self._collect(alive, position, found)
        if not tiers or all(t in tiers for t in LOWER_TIERS):
            found = self._span_lower_tiers(chain, found)
        found.sort()  # by node and tier, then (stable) longest first
        found.sort(key=_num_blocks, reverse=True)
        return found

    def _span_lower_tiers(
        self, chain: Sequence[bytes], found: list[tuple[str, str, int]]
    ) -> list[tuple[str, str, int]]:
        """``found`` with each node's lower-tier run carried on through blocks held in any of
        its lower tiers, reported as its ``s3`` entry when longer than each tier's own."""
        reach: dict[str, int] = {}
        for node_id, tier, num_blocks in found:
            if tier in LOWER_TIERS:
                reach[node_id] = max(reach.get(node_id, 0), num_blocks)
        longer: dict[str, int] = {}
        masks, ids = self._masks, self._ids
        for node_id, start in reach.items():
            bits = 0
            for tier in LOWER_TIERS:
                holder_id = ids.get((node_id, tier))
                if holder_id is not None:
                    bits |= 1 << holder_id
            position = start
            while position < len(chain) and masks.get(chain[position], 0) & bits:
                position += 1
            if position > start:
                longer[node_id] = position
        if not longer:
            return found
        kept = [f for f in found if not (f[1] == S3 and f[0] in longer)]
        return kept + [(node_id, S3, num_blocks) for node_id, num_blocks in longer.items()]

    def _collect(self, mask: int, num_blocks: int, into: list[tuple[str, str, int]]) -> None:
        holders = self._holders
        while mask:
            low = mask & -mask
            node_id, tier = holders[low.bit_length() - 1]
            into.append((node_id, tier, num_blocks))
            mask ^= low

    def _clear_bit(self, block_hash: bytes, holder_id: int) -> None:
        mask = self._masks[block_hash] & ~(1 << holder_id)
        if mask:
            self._masks[block_hash] = mask
            self.replica_bytes -= self._sizes[block_hash]
        else:
            del self._masks[block_hash]
            self.replica_bytes -= self._sizes.pop(block_hash)

    def _release(self, holder: Holder) -> None:
        holder_id = self._ids.pop(holder)
        self._tier_masks[holder[1]] &= ~(1 << holder_id)
        del self._holders[holder_id]
        del self._blocks[holder_id]
        self._free_ids.append(holder_id)
