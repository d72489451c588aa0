"""The predicted time to first token of a request on each prefill node, and the cheapest node.

For a node the TTFT is queue wait + fetch time of the cached blocks it lacks + prefill time of
the rest (``pricing.py``). ``prefill_costs`` prices every node that may take the request (the
SLO's Retry-After and the tests need them all); ``cheapest_prefill`` finds the same winner
while pricing only the nodes that could still beat it, which is what keeps placement fast with
many nodes:

- nodes whose TTFT depends on more than their queue are priced one by one, each from a lower
  bound: holders of a prefix of their own, nodes that measured their links or fit their own
  step times, nodes on the host of a tierd whose NVMe holds the prompt;
- every other node of a pricing class (``index.py``) costs what its class's best case costs,
  holding the common prefix if there is one, plus its queue wait: the class is walked in
  queue order, and the walk stops at the first node that cannot beat the best found, which
  is exact, ties (queue, then id) included.

Blocks may be pulled from any node still alive, draining or unhealthy ones included, and from
any live tierd's NVMe or S3 tier (``sources.py`` prices each pull). Pure: no I/O.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Collection, Iterator, Sequence

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.index import PrefillClass, load_of
from services.scheduler.pricing import Model, PlacementRequest, PrefillCost, Pricing, Pull
from services.scheduler.sources import CommonPrefix
from shared.kv.tiers import DRAM, NVME
from shared.rpc.types import PrefixHolder

__all__ = [
    "PlacementRequest",
    "PrefillCost",
    "Pull",
    "cheapest_prefill",
    "cost_on_node",
    "cost_without_cache",
    "prefill_costs",
]

#: A node of a class to price: (lower bound, load, id, node or None for a marker, model).
_Next = tuple[float, int, str, NodeLoad | None, Model]
#: A node waiting to be priced, and the rest of its class.
_Candidate = tuple[float, int, str, NodeLoad | None, Model, Iterator[_Next] | None]


class _StaleIndex(Exception):
    """A node's load differs from the one the index keeps it under."""


def _takes_work(node: NodeLoad, view: ClusterView, now: float, avoid: Collection[str]) -> bool:
    return view.takes_work(node, "prefill", now, avoid)


def _prefills(view: ClusterView, now: float, avoid: Collection[str]) -> list[NodeLoad]:
    return [n for n in view.targets("prefill", now) if n.node_id not in avoid]


def prefill_costs(
    request: PlacementRequest,
    view: ClusterView,
    holders: Sequence[PrefixHolder],
    now: float,
    avoid: Collection[str] = (),
    common: CommonPrefix | None = None,
) -> list[PrefillCost]:
    """The cost of ``request`` on every prefill node that may take it and is not in ``avoid``
    (nodes in ``avoid`` are not pulled from either: they just failed to answer)."""
    prefills = _prefills(view, now, avoid)
    block_size = prefills[0].block_size if prefills else None
    pricing = Pricing(request, view, holders, now, block_size, avoid, common)
    return [pricing.cost_on(node) for node in prefills]


def cheapest_prefill(
    request: PlacementRequest,
    view: ClusterView,
    holders: Sequence[PrefixHolder],
    now: float,
    avoid: Collection[str] = (),
    common: CommonPrefix | None = None,
) -> PrefillCost | None:
    """``min(prefill_costs(...), key=rank)`` without pricing every node; None when no prefill
    node may take the request."""
    # The groups of holders are cut to the block size of the first node prefill_costs prices.
    first = next((n for n in view.nodes.values() if _takes_work(n, view, now, avoid)), None)
    if first is None:
        return None
    pricing = Pricing(request, view, holders, now, first.block_size, avoid, common)
    try:
        return _search(pricing, now, avoid)
    except _StaleIndex:
        return _cheapest_of(pricing, _prefills(view, now, avoid))


def _search(pricing: Pricing, now: float, avoid: Collection[str]) -> PrefillCost | None:
    view = pricing.view
    alone = _priced_alone(pricing, now, avoid)
    heap: list[_Candidate] = []
    for single in alone.values():
        model = pricing.model(single)
        bound = pricing.lower_bound(single, model)
        heap.append((bound, load_of(single), single.node_id, single, model, None))
    for pricing_class, entries in view.prefill_index.classes.items():
        walk = iter(_ClassWalk(pricing, pricing_class, entries, now, avoid, alone))
        first = next(walk, None)
        if first is not None:
            heap.append((*first, walk))
    heapq.heapify(heap)
    best: PrefillCost | None = None
    while heap:
        bound, load, node_id, node, model, rest = heapq.heappop(heap)
        # No node left costs less than its bound, and a tie goes to the shorter queue, then the
        # lower id: once a bound's rank is past the best, nothing left can win.
        if best is not None and (bound, load, node_id) > best.rank:
            break
        if node is not None:
            cost = pricing.cost_on(node, model)
            if best is None or cost.rank < best.rank:
                best = cost
        if rest is not None:
            following = next(rest, None)
            if following is not None:
                heapq.heappush(heap, (*following, rest))
    return best


def _priced_alone(pricing: Pricing, now: float, avoid: Collection[str]) -> dict[str, NodeLoad]:
    """The prefill nodes whose TTFT depends on more than their class and queue."""
    view, index = pricing.view, pricing.view.prefill_index
    ids: list[str] = []
    for node_id, tier in pricing.cached:
        if tier == DRAM:
            ids.append(node_id)
        elif tier == NVME:
            host = view.nodes[node_id].host_id
            if host:
                ids.extend(index.hosts.get(host, ()))
    ids.extend(index.measured)
    ids.extend(view.timing.individual("prefill"))
    alone = {}
    for node_id in ids:
        node = view.nodes.get(node_id)
        if node is not None and _takes_work(node, view, now, avoid):
            alone[node_id] = node
    return alone


@functools.lru_cache(maxsize=64)
def _typical(pricing_class: PrefillClass) -> NodeLoad:
    """A node of the class that holds nothing, measured nothing and shares no host (read
    only: the walks of every placement share it)."""
    step, block_size, block_bytes = pricing_class
    return NodeLoad(
        "", "prefill", 0, 0, 0, 0, block_size, 0.0,
        block_bytes=block_bytes, max_num_batched_tokens=step,
    )  # fmt: skip


class _ClassWalk:
    """The nodes of one pricing class that may take the request, in queue order, each under
    a lower bound of its TTFT, for ``_search`` to price lazily.

    Every node of the class that measured nothing and is on a host of its own costs what the
    class's typical node costs at its queue, holding the common prefix or not: the first node
    of each kind in queue order beats every later one of its kind, so the walk offers only
    those, and stops once both have come. After the first it offers the bound of all it has
    not offered yet (a *marker*: no node), so the search reads no further than the best found
    allows. Invariant: offers come in non-decreasing order.
    """

    def __init__(
        self,
        pricing: Pricing,
        pricing_class: PrefillClass,
        entries: list[tuple[int, str]],
        now: float,
        avoid: Collection[str],
        alone: dict[str, NodeLoad],
    ) -> None:
        self.pricing, self.entries = pricing, entries
        self.now, self.avoid, self.alone = now, avoid, alone
        view = pricing.view
        step, block_size, _ = pricing_class
        self.model = pricing.model_of(view.timing.shared("prefill"), step, block_size)
        typical = _typical(pricing_class)
        common = pricing.common
        shared = 0 if common is None else min(common.num_blocks, pricing.limit(typical))
        # (compute s, fetch s) of the typical node without the common prefix, and with it.
        self.costs = {False: pricing.best_option(typical, self.model, 0)[:2]}
        if shared:
            self.costs[True] = pricing.best_option(typical, self.model, shared)[:2]
        self.common = common if shared else None

    def bound(self, load: int) -> float:
        wait = self.model.wait_s(load)
        return min(wait + fetch + compute for compute, fetch in self.costs.values())

    def __iter__(self) -> Iterator[_Next]:
        view, nodes, costs, common = (
            self.pricing.view,
            self.pricing.view.nodes,
            self.costs,
            self.common,
        )
        for load, node_id in self.entries:  # no view changes during a placement
            if node_id in self.alone:
                continue
            kind = common is not None and common.holds(node_id)
            if kind not in costs:  # a node of its kind came before: this one cannot win
                continue
            node = nodes[node_id]
            if not _takes_work(node, view, self.now, self.avoid):
                continue
            if load != load_of(node):
                raise _StaleIndex(node_id)
            bound = self.bound(load)
            del costs[kind]
            yield (bound, load, node_id, node, self.model)
            if not costs:
                return
            yield (self.bound(load), load, node_id, None, self.model)


def _cheapest_of(pricing: Pricing, prefills: Sequence[NodeLoad]) -> PrefillCost | None:
    """The node of lowest ``rank`` among ``prefills``, pricing in full only the nodes whose
    lower bound does not exceed the best TTFT found so far."""
    bounds = []
    for node in prefills:
        model = pricing.model(node)
        bounds.append((pricing.lower_bound(node, model), load_of(node), node.node_id, node, model))
    bounds.sort(key=lambda b: b[:3])
    best: PrefillCost | None = None
    for bound, _, _, node, model in bounds:
        # A tie in TTFT is broken by queue and id, so only a strictly larger bound stops.
        if best is not None and bound > best.ttft_s:
            break
        cost = pricing.cost_on(node, model)
        if best is None or cost.rank < best.rank:
            best = cost
    return best


def cost_without_cache(request: PlacementRequest, view: ClusterView, node: NodeLoad) -> PrefillCost:
    """The cost on ``node`` computing the whole prompt (the cache-oblivious baseline)."""
    return cost_on_node(request, view, node, 0)


def cost_on_node(
    request: PlacementRequest, view: ClusterView, node: NodeLoad, local_blocks: int
) -> PrefillCost:
    """The cost on ``node`` computing all but the ``local_blocks`` leading blocks its own pool
    holds, pulling nothing (the baselines that place by load or by local prefix)."""
    holders = [PrefixHolder(node.node_id, DRAM, local_blocks)] if local_blocks > 0 else []
    pricing = Pricing(request, view, holders, node.last_seen, None)
    return pricing.cost_on(node)
