"""Where a request runs: a pure function of the request, the cluster as last seen, and where
its prompt's leading blocks are cached (Mooncake's Conductor).

For each live prefill node the predicted time to first token (TTFT) is

    queue wait + fetch time of the cached blocks it lacks + prefill time of the rest

and the cheapest node wins; the decode node is the one with room whose next step is predicted
fastest. No I/O and no framework here, so the simulator and the unit tests run exactly this code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from services.scheduler.cluster import ClusterView, CostParams, NodeLoad
from services.scheduler.timing import (
    StepCoefficients,
    decode_step_seconds,
    prefill_seconds,
    queue_seconds,
)
from shared.rpc.types import PrefixHolder

__all__ = [
    "ClusterView",
    "CostParams",
    "NodeLoad",
    "Placement",
    "PlacementRequest",
    "PrefillCost",
    "Pull",
    "Rejection",
    "blocks_needed",
    "place",
    "place_round_robin",
    "predicted_tbt",
    "prefill_costs",
    "record_placement",
]

#: Only blocks in a live prefill node's DRAM pool can be pulled from it for now.
PULLABLE_TIER = "dram"


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    num_prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Pull:
    """Prompt blocks ``first_block .. first_block + num_blocks - 1`` come from ``node_id``."""

    node_id: str
    first_block: int
    num_blocks: int


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request runs, what its prefill node pulls first, and what that should cost."""

    prefill_node: str
    decode_node: str
    pulls: tuple[Pull, ...] = ()
    predicted_ttft_s: float = 0.0
    num_cached_tokens: int = 0
    predicted_tbt_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request cannot be placed; ``status`` is the HTTP status the client should see,
    ``cause`` a short label for metrics."""

    reason: str
    status: int = 503
    retry_after_s: float | None = None
    cause: str = "no_node"


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """The predicted TTFT of a request on one prefill node, by part. Invariant: the cached
    prefix is ``cached_blocks`` long and ``pulls`` cover exactly the part not held locally."""

    node_id: str
    wait_s: float
    fetch_s: float
    compute_s: float
    cached_blocks: int
    cached_tokens: int
    pulls: tuple[Pull, ...]
    queued_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.wait_s + self.fetch_s + self.compute_s


def place(
    request: PlacementRequest,
    view: ClusterView,
    holders: Sequence[PrefixHolder],
    now: float,
    slo_s: float | None = None,
) -> Placement | Rejection:
    """The cheapest prefill node and the best decode node for ``request``; a 503 when a role
    has no live node, a 429 when even the cheapest TTFT exceeds ``slo_s``. ``holders`` is
    cachemeta's answer for the prompt's blocks (empty: place without regard to caches)."""
    costs = prefill_costs(request, view, holders, now)
    if not costs:
        return Rejection("no prefill node is available", cause="no_prefill_node")
    best = min(costs, key=lambda c: (c.ttft_s, c.queued_tokens, c.node_id))
    return _finish(request, view, now, best, costs, slo_s)


def place_round_robin(
    request: PlacementRequest, view: ClusterView, turn: int, now: float, slo_s: float | None = None
) -> Placement | Rejection:
    """The cache-oblivious baseline (for benchmarks): the ``turn``-th live prefill node in id
    order, no pulls; decode node and SLO check as in ``place``."""
    prefills = sorted(view.live("prefill", now), key=lambda n: n.node_id)
    if not prefills:
        return Rejection("no prefill node is available", cause="no_prefill_node")
    cost = _cost_on(prefills[turn % len(prefills)], request, {}, view)
    return _finish(request, view, now, cost, [cost], slo_s)


def _finish(
    request: PlacementRequest,
    view: ClusterView,
    now: float,
    chosen: PrefillCost,
    costs: Sequence[PrefillCost],
    slo_s: float | None,
) -> Placement | Rejection:
    """Checks the SLO for the chosen prefill node, then adds the decode node."""
    decodes = view.live("decode", now)
    if not decodes:
        return Rejection("no decode node is available", cause="no_decode_node")
    if slo_s is not None and chosen.ttft_s > slo_s:
        reason = (
            f"The predicted time to first token ({chosen.ttft_s:.2f} s) exceeds the service "
            f"objective of {slo_s:.2f} s; the servers are overloaded, retry later."
        )
        return Rejection(reason, 429, _retry_after(costs, slo_s), cause="ttft_slo")
    decode, tbt = _choose_decode(decodes, request, view)
    return Placement(
        prefill_node=chosen.node_id,
        decode_node=decode.node_id,
        pulls=chosen.pulls,
        predicted_ttft_s=chosen.ttft_s,
        num_cached_tokens=chosen.cached_tokens,
        predicted_tbt_s=tbt,
    )


def prefill_costs(
    request: PlacementRequest, view: ClusterView, holders: Sequence[PrefixHolder], now: float
) -> list[PrefillCost]:
    """The cost of ``request`` on every live prefill node."""
    prefills = view.live("prefill", now)
    cached = _pullable(holders, {n.node_id for n in prefills})
    groups = _holder_groups(cached, request, prefills)
    memo: dict[tuple[StepCoefficients, int, int, int], float] = {}
    return [_cost_on(node, request, cached, view, groups, memo) for node in prefills]


@dataclass(frozen=True, slots=True)
class _HolderGroup:
    """The live prefill nodes holding exactly ``num_blocks`` usable leading blocks."""

    num_blocks: int
    node_ids: list[str]  # sorted
    members: frozenset[str]


def _holder_groups(
    cached: dict[str, int], request: PlacementRequest, prefills: Sequence[NodeLoad]
) -> list[_HolderGroup]:
    """Holders grouped by how many usable blocks they hold (computed once per placement, so
    pricing every node stays linear in the number of nodes)."""
    if not cached or not prefills:
        return []
    limit = max(request.num_prompt_tokens - 1, 0) // prefills[0].block_size
    by_count: dict[int, list[str]] = {}
    for node_id, count in cached.items():
        by_count.setdefault(min(count, limit), []).append(node_id)
    return [
        _HolderGroup(count, sorted(ids), frozenset(ids)) for count, ids in sorted(by_count.items())
    ]


def _pullable(holders: Iterable[PrefixHolder], live: set[str]) -> dict[str, int]:
    """Leading blocks each live prefill node holds in its pool."""
    cached: dict[str, int] = {}
    for h in holders:
        if h.tier == PULLABLE_TIER and h.node_id in live and h.num_blocks > 0:
            cached[h.node_id] = max(cached.get(h.node_id, 0), h.num_blocks)
    return cached


def _cost_on(
    node: NodeLoad,
    request: PlacementRequest,
    cached: dict[str, int],
    view: ClusterView,
    groups: Sequence[_HolderGroup] = (),
    memo: dict[tuple[StepCoefficients, int, int, int], float] | None = None,
) -> PrefillCost:
    """Computes what ``node`` lacks, or pulls it from the holder that makes this cheapest.
    ``memo`` shares prefill times between nodes of one placement that have the same model."""
    bs, prompt = node.block_size, request.num_prompt_tokens
    limit = max(prompt - 1, 0) // bs  # the last token is always computed
    coef = view.timing.coefficients(node.node_id, "prefill")
    step = node.max_num_batched_tokens or view.costs.max_num_batched_tokens
    times = {} if memo is None else memo

    def compute_s(blocks: int) -> float:
        key = (coef, step, bs, blocks)
        if key not in times:
            times[key] = prefill_seconds(coef, prompt - blocks * bs, blocks * bs, step)
        return times[key]

    local = min(cached.get(node.node_id, 0), limit)
    best: tuple[float, float, int, tuple[Pull, ...]] = (compute_s(local), 0.0, local, ())
    for remote, source, bandwidth in _sources(node, groups, limit, local, view):
        missing_bytes = (remote - local) * view.block_bytes(node)
        fetch = view.costs.pull_overhead_s + missing_bytes / bandwidth
        compute = compute_s(remote)
        if fetch + compute < best[0] + best[1]:
            best = (compute, fetch, remote, (Pull(source, local, remote - local),))
    compute, fetch, blocks, pulls = best
    queued = node.queued_tokens + node.placed_tokens
    return PrefillCost(
        node_id=node.node_id,
        wait_s=queue_seconds(coef, queued, step),
        fetch_s=fetch,
        compute_s=compute,
        cached_blocks=blocks,
        cached_tokens=blocks * bs,
        pulls=pulls,
        queued_tokens=queued,
    )


def _sources(
    node: NodeLoad, groups: Sequence[_HolderGroup], limit: int, local: int, view: ClusterView
) -> list[tuple[int, str, float]]:
    """``(blocks, source, bandwidth)`` of the peers worth pulling from: for each number of
    leading blocks beyond ``local``, only the holder with the fastest link to ``node`` (ties:
    the lowest id), since every other holder of as many blocks costs at least as much."""
    out: list[tuple[int, str, float]] = []
    if not groups or groups[-1].num_blocks <= local:
        return out
    fallback = view.fallback_bandwidth(node)
    me = node.node_id
    measured = {s: bw for s, bw in node.fetch_bandwidth.items() if bw > 0 and s != me}
    for group in groups:
        remote = min(group.num_blocks, limit)
        if remote <= local:
            continue
        # Unmeasured links all get the fallback: the lowest such id stands for them.
        unmeasured = next((s for s in group.node_ids if s != me and s not in measured), None)
        best = None if unmeasured is None else (-fallback, unmeasured)
        for source, bandwidth in measured.items():
            if source in group.members and (best is None or (-bandwidth, source) < best):
                best = (-bandwidth, source)
        if best is not None:
            out.append((remote, best[1], -best[0]))
    return out


def _retry_after(costs: Sequence[PrefillCost], slo_s: float) -> float:
    """When a retry may fit: a node's TTFT falls about as fast as its queue drains, so it meets
    the objective after its excess over it, or (if the queue alone cannot explain the excess)
    once its queue is empty. At least one second."""
    return max(1.0, min(min(c.ttft_s - slo_s, c.wait_s) for c in costs))


def predicted_tbt(node: NodeLoad, request: PlacementRequest, view: ClusterView) -> float:
    """One decode step of ``node`` with this request added to its batch and its KV."""
    coef = view.timing.coefficients(node.node_id, "decode")
    batch = node.running_seqs + node.placed_seqs + 1
    used_blocks = max(node.total_blocks - node.free_blocks, 0) + node.placed_blocks
    context = used_blocks * node.block_size + request.num_prompt_tokens
    return decode_step_seconds(coef, batch, context)


def _choose_decode(
    decodes: Sequence[NodeLoad], request: PlacementRequest, view: ClusterView
) -> tuple[NodeLoad, float]:
    """The fastest predicted node among those with room; when none has room, the one with the
    fewest sequences (the request queues there rather than failing)."""
    tbt = {n.node_id: predicted_tbt(n, request, view) for n in decodes}
    with_room = [n for n in decodes if _has_room(n, request)]
    if with_room:
        chosen = min(with_room, key=lambda n: (tbt[n.node_id], _seqs(n), n.node_id))
    else:
        chosen = min(decodes, key=lambda n: (_seqs(n), n.node_id))
    return chosen, tbt[chosen.node_id]


def record_placement(view: ClusterView, placement: Placement, request: PlacementRequest) -> None:
    """Counts the request against its nodes until their next heartbeats."""
    prefill = view.nodes[placement.prefill_node]
    prefill.placed_tokens += request.num_prompt_tokens - placement.num_cached_tokens
    decode = view.nodes[placement.decode_node]
    decode.placed_seqs += 1
    decode.placed_blocks += blocks_needed(decode, request)


def blocks_needed(node: NodeLoad, request: PlacementRequest) -> int:
    return -(-(request.num_prompt_tokens + request.max_tokens) // node.block_size)


def _seqs(node: NodeLoad) -> int:
    return node.running_seqs + node.placed_seqs


def _has_room(node: NodeLoad, request: PlacementRequest) -> bool:
    return node.free_blocks - node.placed_blocks >= blocks_needed(node, request)
