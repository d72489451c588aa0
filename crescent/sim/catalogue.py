"""Which simulated pools hold a prompt's leading blocks: what cachemeta answers the scheduler.

A bit per pool per block, as cachemeta's own index keeps them (``services/cachemeta/index.py``).
Pools evict without telling, so a bit may outlive its block; every answer is checked against
the pools themselves, and a stale bit found on the way is cleared. The blocks every prompt
shares (a trace's system prompt: its first block) are held by nearly every pool: the pools
holding only that much are answered as a ``CommonPrefix`` instead of a holder each, and
checked only for the pools placement asks about.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from crescent.sim.pool import BlockPool
from shared.kv.tiers import DRAM
from shared.rpc.types import PrefixHolder

#: Pools holding only the first block that are still listed one by one.
LISTED_AT_MOST = 8


def _bits(mask: int) -> Iterator[int]:
    """The set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class FirstBlockHolders:
    """The pools that hold a prompt's first block and, by their bits, not its second: a
    ``CommonPrefix`` of one block, checked lazily against the pools."""

    __slots__ = ("_catalogue", "_first", "_mask")
    num_blocks = 1

    def __init__(self, catalogue: Catalogue, first: bytes, mask: int) -> None:
        self._catalogue, self._first, self._mask = catalogue, first, mask

    def holds(self, node_id: str) -> bool:
        at = self._catalogue.bit_of.get(node_id)
        if at is None or not self._mask >> at & 1:
            return False
        return self._catalogue.check(at, self._first)

    def ascending(self) -> Iterator[str]:
        ids = self._catalogue.ids
        return (ids[at] for at in _bits(self._mask))


@dataclass(frozen=True, slots=True)
class Match:
    """Cachemeta's answer for one prompt: the holders listed, and those of the first block
    alone that are too many to list."""

    holders: list[PrefixHolder]
    common: FirstBlockHolders | None


def matched_by(prompts: Iterable[Sequence[bytes]]) -> set[bytes]:
    """The blocks whose bits ``Catalogue.match`` reads for these prompts: each one's first
    two. A simulation that knows its prompts in advance stores only those."""
    return {key for keys in prompts for key in keys[:2]}


class Catalogue:
    """Owns a bit per (pool, block) for every block a pool stored since its bit was last
    cleared. Invariant: a pool holding a block has its bit set; bits are in node id order.
    Blocks are named as the pools name them (``pool.block_key`` of their hash ids); the bits
    of blocks no prompt is matched by (``matched_by``) may be left unstored."""

    def __init__(self, pools: Mapping[str, BlockPool]) -> None:
        self.ids = sorted(pools)
        self.bit_of = {node_id: at for at, node_id in enumerate(self.ids)}
        self.pools = [pools[node_id] for node_id in self.ids]
        self.masks: dict[bytes, int] = {}

    def stored(self, node_id: str, keys: Sequence[bytes]) -> None:
        """``node_id``'s pool has just stored (or read) ``keys``."""
        bit = 1 << self.bit_of[node_id]
        masks = self.masks
        for key in keys:
            masks[key] = masks.get(key, 0) | bit

    def check(self, at: int, key: bytes) -> bool:
        """Whether pool ``at`` holds ``key``; clears its bit if not."""
        if self.pools[at].holds_key(key):
            return True
        self._clear(at, key)
        return False

    def _clear(self, at: int, key: bytes) -> None:
        mask = self.masks.get(key, 0) & ~(1 << at)
        if mask:
            self.masks[key] = mask
        else:
            self.masks.pop(key, None)

    def match(self, keys: Sequence[bytes]) -> Match:
        """Every pool holding a leading part of ``keys``, with its exact length."""
        if not keys:
            return Match([], None)
        masks = self.masks
        first = keys[0]
        holding = masks.get(first, 0)
        deeper = holding & masks.get(keys[1], 0) if len(keys) > 1 else 0
        holders = []
        for at in _bits(deeper):
            held = self.pools[at].lookup_keys(keys)
            if held < len(keys):
                self._clear(at, keys[held])
            if held:
                holders.append(PrefixHolder(self.ids[at], DRAM, held))
        shallow = holding & ~deeper
        if shallow.bit_count() > LISTED_AT_MOST:
            return Match(holders, FirstBlockHolders(self, first, shallow))
        for at in _bits(shallow):
            if self.check(at, first):
                holders.append(PrefixHolder(self.ids[at], DRAM, 1))
        return Match(holders, None)
