"""Where a prefill node can pull a prompt's cached blocks from, and what each pull costs.

A source is a live prefill or decode node holding the leading blocks in its pool (``dram``), or
a live tierd holding them on NVMe or in S3. Pulling ``r - local`` blocks from a source costs

    pull overhead + the tier's latency + (r - local) * block bytes / bandwidth(node <- source)

with the bandwidth of ``ClusterView.fetch_bandwidth`` (a pool) or ``ClusterView.tier_bandwidth``
(a tierd's tier). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from services.scheduler.cluster import TIERD, ClusterView, NodeLoad
from shared.kv.tiers import DRAM, LOWER_TIERS, NVME, S3
from shared.rpc.types import PrefixHolder

#: The tiers placement can pull from: a node's pool, a tierd's NVMe files and S3.
PULLABLE_TIERS = (DRAM, NVME, S3)
#: Among pulls that cost the same, the faster tier is preferred (less work at the source).
_TIER_ORDER = {DRAM: 0, NVME: 1, S3: 2}

#: A holder of cached blocks: (node id, tier).
Holder = tuple[str, str]
#: The links a node that measured none measured (read only).
_NONE: Mapping[str, float] = MappingProxyType({})
#: A pull worth pricing: (leading blocks cached after it, source, tier, fetch seconds). A
#: plain tuple: placement makes one per holder length for every node it prices.
Option = tuple[int, str, str, float]


class CommonPrefix(Protocol):
    """Pools holding the first ``num_blocks`` blocks of a prompt, given without a holder per
    pool (the blocks nearly every prompt and every pool share, a system prompt say): the same
    as ``PrefixHolder(node_id, DRAM, num_blocks)`` for every node ``holds`` accepts."""

    @property
    def num_blocks(self) -> int: ...

    def holds(self, node_id: str) -> bool: ...

    def ascending(self) -> Iterable[str]:
        """Every node ``holds`` accepts (others may come too), lowest id first."""
        ...


class CommonMembers:
    """The pools of a ``CommonPrefix`` a placement may pull from (``accept``: live, not to be
    avoided, not listed as holders of their own), found lazily, lowest id first. Invariant:
    ``_found`` is the accepted holders among the ids ``_rest`` has given, in order."""

    __slots__ = ("_found", "_rest", "accept", "prefix")

    def __init__(self, prefix: CommonPrefix, accept: Callable[[str], bool]) -> None:
        self.prefix, self.accept = prefix, accept
        self._found: list[str] = []
        self._rest: Iterator[str] = iter(prefix.ascending())

    def has(self, node_id: str) -> bool:
        return self.accept(node_id) and self.prefix.holds(node_id)

    def first_except(self, skip: Callable[[str], bool]) -> str | None:
        """The lowest id among the members that ``skip`` does not reject."""
        at = 0
        while True:
            if at == len(self._found):
                found = next((s for s in self._rest if self.has(s)), None)
                if found is None:
                    return None
                self._found.append(found)
            if not skip(self._found[at]):
                return self._found[at]
            at += 1


@dataclass(frozen=True, slots=True)
class HolderGroup:
    """The sources holding exactly ``num_blocks`` usable leading blocks: pools by node id
    (``node_ids`` sorted, ``members`` the same ids), tierd tiers (``lower``, sorted) and the
    pools of a common prefix not listed on their own (``common``)."""

    num_blocks: int
    node_ids: list[str]
    members: frozenset[str]
    lower: tuple[Holder, ...]
    common: CommonMembers | None = None

    def has_pool(self, node_id: str) -> bool:
        return node_id in self.members or (self.common is not None and self.common.has(node_id))

    def lowest_pool(self, skip: Callable[[str], bool]) -> str | None:
        """The lowest pool id ``skip`` does not reject."""
        found = next((s for s in self.node_ids if not skip(s)), None)
        if self.common is not None:
            other = self.common.first_except(skip)
            if other is not None and (found is None or other < found):
                found = other
        return found


def pullable(holders: Iterable[PrefixHolder], sources: Mapping[str, NodeLoad]) -> dict[Holder, int]:
    """Leading blocks each live source holds, per (node, tier): a prefill or decode node's
    pool, a tierd's lower tiers. Anything else (a dead node, a tierd's DRAM, a node's NVMe)
    cannot be pulled."""
    cached: dict[Holder, int] = {}
    for h in holders:
        source = sources.get(h.node_id)
        if source is None or h.num_blocks <= 0:
            continue
        if h.tier not in (LOWER_TIERS if source.role == TIERD else (DRAM,)):
            continue
        key = (h.node_id, h.tier)
        cached[key] = max(cached.get(key, 0), h.num_blocks)
    return cached


def holder_groups(
    cached: Mapping[Holder, int], limit: int, common: CommonMembers | None = None
) -> list[HolderGroup]:
    """Holders grouped by how many usable blocks (at most ``limit``) they hold, fewest first
    (computed once per placement, so pricing every node stays linear in the number of
    nodes); the members of ``common`` join the group of its length."""
    pools: dict[int, list[str]] = {}
    lower: dict[int, list[Holder]] = {}
    for (node_id, tier), count in cached.items():
        blocks = min(count, limit)
        if tier == DRAM:
            pools.setdefault(blocks, []).append(node_id)
        else:
            lower.setdefault(blocks, []).append((node_id, tier))
    shared = -1 if common is None else min(common.prefix.num_blocks, limit)
    if shared >= 0:
        pools.setdefault(shared, [])
    groups = []
    for blocks in sorted(pools.keys() | lower.keys()):
        ids = sorted(pools.get(blocks, ()))
        lower_here = tuple(sorted(lower.get(blocks, ())))
        members = common if blocks == shared else None
        groups.append(HolderGroup(blocks, ids, frozenset(ids), lower_here, members))
    return groups


def options(
    node: NodeLoad, groups: Sequence[HolderGroup], limit: int, local: int, view: ClusterView
) -> list[Option]:
    """The pulls worth pricing for ``node``, which holds ``local`` leading blocks itself: for
    each number of leading blocks beyond ``local``, only the cheapest pull of that many (ties:
    the faster tier, then the lower id), since every other costs at least as much."""
    out: list[Option] = []
    if not groups or groups[-1].num_blocks <= local:
        return out
    transfer = view.fallback_bandwidth(node)
    me = node.node_id
    links = node.fetch_bandwidth
    measured = {s: bw for s, bw in links.items() if bw > 0 and s != me} if links else _NONE
    block_bytes = view.block_bytes(node)
    overhead = view.costs.pull_overhead_s
    for group in groups:
        remote = min(group.num_blocks, limit)
        if remote <= local:
            continue
        missing = (remote - local) * block_bytes
        # Inline, not a call: this runs for every holder length on every node priced.
        # Unmeasured links all get the fallback: the lowest such id stands for them.
        if group.common is None:
            unmeasured = next((s for s in group.node_ids if s != me and s not in measured), None)
        else:
            unmeasured = group.lowest_pool(lambda s: s == me or s in measured)
        pool = None if unmeasured is None else (-transfer, unmeasured)
        for source, bandwidth in measured.items():
            if group.has_pool(source) and (pool is None or (-bandwidth, source) < pool):
                pool = (-bandwidth, source)
        if not group.lower:  # pools only, the common case: nothing else to compare
            if pool is not None:
                out.append((remote, pool[1], DRAM, overhead + missing / -pool[0]))
            continue
        best = None if pool is None else (overhead + missing / -pool[0], 0, pool[1], DRAM)
        for tierd, tier in group.lower:
            bandwidth = view.tier_bandwidth(node, tierd, tier, transfer)
            fetch = overhead + view.costs.tier_latency_s(tier) + missing / bandwidth
            candidate = (fetch, _TIER_ORDER[tier], tierd, tier)
            if best is None or candidate < best:
                best = candidate
        if best is not None:
            out.append((remote, best[2], best[3], best[0]))
    return out
