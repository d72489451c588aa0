"""Where a request runs: a pure function of the request, the cluster as last seen, and where
its prompt's leading blocks are cached (Mooncake's Conductor).

For each live prefill node the predicted time to first token (TTFT) is

    queue wait + fetch time of the cached blocks it lacks + prefill time of the rest

and the cheapest node wins; the decode node is the one with room whose next step is predicted
fastest. No I/O and no framework here, so the simulator and the unit tests run exactly this code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.scheduler.cluster import ClusterView, CostParams, NodeLoad
from services.scheduler.costs import (
    PlacementRequest,
    PrefillCost,
    Pull,
    cheapest_prefill,
    cost_without_cache,
    prefill_costs,
)
from services.scheduler.timing import decode_step_seconds
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
    best = cheapest_prefill(request, view, holders, now)
    if best is None:
        return Rejection("no prefill node is available", cause="no_prefill_node")
    return _finish(
        request, view, now, best, lambda: prefill_costs(request, view, holders, now), slo_s
    )


def place_round_robin(
    request: PlacementRequest, view: ClusterView, turn: int, now: float, slo_s: float | None = None
) -> Placement | Rejection:
    """The cache-oblivious baseline (for benchmarks): the ``turn``-th live prefill node in id
    order, no pulls; decode node and SLO check as in ``place``."""
    prefills = sorted(view.live("prefill", now), key=lambda n: n.node_id)
    if not prefills:
        return Rejection("no prefill node is available", cause="no_prefill_node")
    cost = cost_without_cache(request, view, prefills[turn % len(prefills)])
    return _finish(request, view, now, cost, lambda: [cost], slo_s)


def _finish(
    request: PlacementRequest,
    view: ClusterView,
    now: float,
    chosen: PrefillCost,
    all_costs: Callable[[], Sequence[PrefillCost]],
    slo_s: float | None,
) -> Placement | Rejection:
    """Checks the SLO for the chosen prefill node, then adds the decode node. ``all_costs``
    prices every candidate, which only a rejection's Retry-After needs."""
    decodes = view.live("decode", now)
    if not decodes:
        return Rejection("no decode node is available", cause="no_decode_node")
    if slo_s is not None and chosen.ttft_s > slo_s:
        reason = (
            f"The predicted time to first token ({chosen.ttft_s:.2f} s) exceeds the service "
            f"objective of {slo_s:.2f} s; the servers are overloaded, retry later."
        )
        return Rejection(reason, 429, _retry_after(all_costs(), slo_s), cause="ttft_slo")
    decode, tbt = _choose_decode(decodes, request, view)
    return Placement(
        prefill_node=chosen.node_id,
        decode_node=decode.node_id,
        pulls=chosen.pulls,
        predicted_ttft_s=chosen.ttft_s,
        num_cached_tokens=chosen.cached_tokens,
        predicted_tbt_s=tbt,
    )


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
