"""Reusing the leading tokens of a block: the last, partly filled block of finished
sequences, and the first tokens of a cached full block.

Only full blocks are shared under a hash, and a prompt's last token is always computed, so a
prompt asked again would recompute everything after its last whole block that excludes that
token: up to a block of tokens, a prefill step where a one-token step would do. Two sources
cover the tokens before it:

- a full cached block after the same chain parent whose first tokens are the prompt's (the
  earlier request went on generating into it): the new sequence gets a copy of it (it will
  write its own tokens after the shared ones, and the cached block must stay as it is);
- the partial last block of a sequence that ended: it goes back to the pool's free queue like
  any other, but its slot keeps the KV until the pool hands it out again. ``PartialBlocks``
  remembers, per chain parent, which tokens that KV belongs to; the new sequence takes the slot
  back (it alone) without a copy. A slot handed out since (its ``generation`` moved on) is
  simply forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from shared.kv.hashing import BlockHash
from shared.kv.pool import KVBlock

#: Partial blocks remembered at most (the oldest are forgotten first); each costs a few
#: hundred bytes here, and nothing in the pool.
MAX_PARTIAL_BLOCKS = 1024


@dataclass(slots=True)
class PartialBlock:
    """Slot ``block`` held the KV of ``token_ids`` after the chain ending at ``parent`` when
    its sequence ended, at pool ``generation``."""

    parent: BlockHash
    block: KVBlock
    generation: int
    token_ids: tuple[int, ...]

    @property
    def intact(self) -> bool:
        """The slot is still unreferenced and was not handed out since."""
        b = self.block
        return b.ref_cnt == 0 and b.generation == self.generation and b.block_hash is None


@dataclass(slots=True)
class PartialHit:
    """``num_tokens`` leading tokens of ``source``'s KV a sequence may reuse: by taking the
    slot back from ``entry`` (a remembered partial block), or, when ``entry`` is None (a cached
    full block, shared), by copying it into a block of its own."""

    source: KVBlock
    num_tokens: int
    entry: PartialBlock | None = None


class PartialBlocks:
    """Owns the remembered partial blocks, by chain parent, oldest first.

    Invariant: every entry is under its own ``parent``, and a slot is in at most one entry
    (remembering a slot again replaces its earlier entry).
    """

    def __init__(self, capacity: int = MAX_PARTIAL_BLOCKS) -> None:
        self.capacity = capacity
        self._by_slot: OrderedDict[int, PartialBlock] = OrderedDict()
        self._by_parent: dict[BlockHash, list[PartialBlock]] = {}

    def __len__(self) -> int:
        return len(self._by_slot)

    def remember(self, parent: BlockHash, block: KVBlock, token_ids: tuple[int, ...]) -> None:
        self._drop(block.block_id)
        entry = PartialBlock(parent, block, block.generation, token_ids)
        self._by_slot[block.block_id] = entry
        self._by_parent.setdefault(parent, []).append(entry)
        while len(self._by_slot) > self.capacity:
            _, oldest = self._by_slot.popitem(last=False)
            self._unlist(oldest)

    def find(self, parent: BlockHash, token_ids: list[int], limit: int) -> PartialHit | None:
        """The intact entry under ``parent`` sharing the most leading tokens with
        ``token_ids`` (at most ``limit`` of them count); None when none shares any."""
        best: PartialHit | None = None
        for entry in list(self._by_parent.get(parent, ())):
            if not entry.intact:
                self._drop(entry.block.block_id)
                continue
            shared = common_prefix(entry.token_ids, token_ids, limit)
            if shared and (best is None or shared > best.num_tokens):
                best = PartialHit(entry.block, shared, entry)
        return best

    def take(self, entry: PartialBlock) -> KVBlock:
        """Forgets ``entry``; its slot is the taker's from now on."""
        self._drop(entry.block.block_id)
        return entry.block

    def clear(self) -> None:
        self._by_slot.clear()
        self._by_parent.clear()

    def _drop(self, block_id: int) -> None:
        entry = self._by_slot.pop(block_id, None)
        if entry is not None:
            self._unlist(entry)

    def _unlist(self, entry: PartialBlock) -> None:
        siblings = self._by_parent.get(entry.parent)
        if siblings is None:
            return
        siblings.remove(entry)
        if not siblings:
            del self._by_parent[entry.parent]


def common_prefix(a: tuple[int, ...], b: list[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``."""
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return max(n, 0)
