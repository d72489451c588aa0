"""Where the scheduler has just placed prompts, until the catalogue knows it.

A node tells cachemeta of the blocks it cached a sync round after computing them (every
200 ms or so; later on a loaded host), so a prompt asked again right after it was placed
may be looked up before its blocks are listed. Placing it then as if nothing were cached sends
it to whichever node is cheapest from scratch, and when that is not the node that just
computed it, it is computed again (with two prefill nodes, whenever the one that computed it
looks busier; with conditional disaggregation, whenever a decode node that prefilled it does).
The placements themselves say where those blocks are going to be: this remembers, for a few
seconds, the leading block hashes of each prompt placed and the node prefilling it, and
answers as cachemeta would. Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from shared.kv.hashing import BlockHash
from shared.kv.tiers import DRAM
from shared.rpc.types import PrefixHolder

#: Long enough for a few sync rounds and a slow lookup, short enough that an eviction since
#: costs at most a pull that finds less than it hoped (then the rest is computed).
TTL_S = 3.0


class RecentPlacements:
    """Owns the block hashes of recently placed prompts and the node placed on.

    Invariant: ``_nodes[h]`` maps each node placed a prompt with block ``h`` to when that
    record expires; ``_expiries`` lists every record in the order it expires (a record made
    again is listed again, and only its last expiry counts).
    """

    def __init__(self, ttl_s: float = TTL_S) -> None:
        self.ttl_s = ttl_s
        self._nodes: dict[BlockHash, dict[str, float]] = {}
        self._expiries: deque[tuple[float, BlockHash, str]] = deque()

    def __len__(self) -> int:
        return len(self._nodes)

    def record(
        self,
        block_hashes: Sequence[BlockHash],
        node_id: str,
        now: float,
        ready_in_s: float = 0.0,
    ) -> None:
        """``node_id`` will cache ``block_hashes`` (a prompt's leading blocks, in order), in
        about ``ready_in_s``: the record lasts ``ttl_s`` from then, so a prefill slower than
        the catalogue's sync rounds is not forgotten before the catalogue lists it."""
        self._expire(now)
        until = now + max(ready_in_s, 0.0) + self.ttl_s
        for block_hash in block_hashes:
            self._nodes.setdefault(block_hash, {})[node_id] = until
            self._expiries.append((until, block_hash, node_id))

    def holders(self, block_hashes: Sequence[BlockHash], now: float) -> list[PrefixHolder]:
        """Each node's leading run of ``block_hashes`` among the unexpired records."""
        self._expire(now)
        runs: dict[str, int] = {}
        going: set[str] | None = None
        for i, block_hash in enumerate(block_hashes):
            nodes = self._nodes.get(block_hash)
            here = set(nodes) if nodes else set()
            going = here if going is None else going & here
            if not going:
                break
            for node_id in going:
                runs[node_id] = i + 1
        return [PrefixHolder(node_id, DRAM, blocks) for node_id, blocks in sorted(runs.items())]

    def forget(self, node_id: str) -> None:
        """``node_id`` restarted or went away: its pool holds none of what was placed there.
        (Its expiry entries stay queued; expiring a record already gone is a no-op.)"""
        for block_hash in [h for h, nodes in self._nodes.items() if node_id in nodes]:
            nodes = self._nodes[block_hash]
            del nodes[node_id]
            if not nodes:
                del self._nodes[block_hash]

    def _expire(self, now: float) -> None:
        while self._expiries and self._expiries[0][0] <= now:
            until, block_hash, node_id = self._expiries.popleft()
            nodes = self._nodes.get(block_hash)
            if nodes is not None and nodes.get(node_id) == until:
                del nodes[node_id]
                if not nodes:
                    del self._nodes[block_hash]


def merge(listed: Sequence[PrefixHolder], recent: Sequence[PrefixHolder]) -> list[PrefixHolder]:
    """cachemeta's holders with the recent placements': a node's pool counted once, at the
    longer of the two runs."""
    out = list(listed)
    index = {(h.node_id, h.tier): i for i, h in enumerate(out)}
    for holder in recent:
        at = index.get((holder.node_id, holder.tier))
        if at is None:
            index[(holder.node_id, holder.tier)] = len(out)
            out.append(holder)
        elif out[at].num_blocks < holder.num_blocks:
            out[at] = holder
    return out
