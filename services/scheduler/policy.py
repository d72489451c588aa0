"""Where a request runs: a pure function of the request, the cluster as last seen, and where
its prompt's leading blocks are cached (Mooncake's Conductor).

For each prefill node that may take work the predicted time to first token (TTFT) is

    queue wait + fetch time of the cached blocks it lacks + prefill time of the rest

and the cheapest node wins. Decode nodes are ranked by their load predicted for when that
prefill ends (``forecast.py``): those with room first, the fastest predicted step first. With
``local_prefill``, a request whose prefill costs everyone less on a decode node than a
hand-off does is prefilled there instead (``disaggregation.py``). A request is refused at
once (429) when its TTFT or, on every decode node, its time between tokens would miss an
objective. No I/O and no framework here, so the simulator and the unit
tests run exactly this code.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from services.scheduler.cluster import ClusterView, CostParams, NodeLoad
from services.scheduler.costs import (
    PlacementRequest,
    PrefillCost,
    Pull,
    cheapest_prefill,
    cost_on_node,
    cost_without_cache,
    prefill_costs,
)
from services.scheduler.disaggregation import choose_local
from services.scheduler.forecast import DecodeForecast, blocks_needed, retry_after
from services.scheduler.inflight import InFlight
from services.scheduler.ranking import best_decodes, rank_key
from services.scheduler.sources import CommonPrefix
from shared.rpc.types import PrefixHolder

__all__ = [
    "ClusterView",
    "CommonPrefix",
    "CostParams",
    "DecodeForecast",
    "NodeLoad",
    "Placement",
    "PlacementRequest",
    "PrefillCost",
    "Pull",
    "Rejection",
    "blocks_needed",
    "place",
    "place_on",
    "place_round_robin",
    "prefill_costs",
    "rank_decodes",
    "record_placement",
]

#: Decode nodes a placement names; the prefill node hands off to the first that accepts.
MAX_DECODE_CANDIDATES = 3


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request runs, what its prefill node pulls first, and what that should cost.
    ``decode_nodes`` are ranked, best first (at least one); ``placed_at`` is the ``now`` it was
    computed for, so ``placed_at + predicted_ttft_s`` is when its prefill should end, and
    ``placed_at + predicted_wait_s`` when its prefill node's queue reaches it. ``local``: the
    prefill node is the decode node itself (``decode_nodes == [prefill_node]``), no hand-off."""

    prefill_node: str
    decode_nodes: list[str]
    pulls: tuple[Pull, ...] = ()
    predicted_ttft_s: float = 0.0
    num_cached_tokens: int = 0
    predicted_tbt_s: float = 0.0
    placed_at: float = 0.0
    predicted_wait_s: float = 0.0

    @property
    def local(self) -> bool:
        # A prefill node is never a decode node: the two coincide only for a local prefill.
        return self.decode_nodes == [self.prefill_node]

    @property
    def decode_node(self) -> str:
        return self.decode_nodes[0]


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request cannot be placed; ``status`` is the HTTP status the client should see,
    ``cause`` a short label for metrics."""

    reason: str
    status: int = 503
    retry_after_s: float | None = None
    cause: str = "no_node"


@dataclass(frozen=True, slots=True)
class _Terms:
    """What a placement must respect besides load. A resumed request (the continuation of one
    already accepted) is never refused by an objective, only for want of nodes."""

    ttft_slo_s: float | None
    tbt_slo_s: float | None
    avoid: Collection[str]
    resumed: bool
    # Where the request's prefix is cached, to price prefilling on a decode node; None: never.
    local_from: tuple[Sequence[PrefixHolder], CommonPrefix | None] | None = None


def place(
    request: PlacementRequest,
    view: ClusterView,
    holders: Sequence[PrefixHolder],
    now: float,
    slo_s: float | None = None,
    *,
    tbt_slo_s: float | None = None,
    avoid: Collection[str] = (),
    resumed: bool = False,
    common: CommonPrefix | None = None,
    local_prefill: bool = False,
) -> Placement | Rejection:
    """The cheapest prefill node and the ranked decode nodes for ``request``, none of them in
    ``avoid``; a 503 when a role has no node to take it, a 429 when even the cheapest TTFT
    exceeds ``slo_s`` or no decode node is predicted to meet ``tbt_slo_s`` with room (unless
    ``resumed``). ``holders`` is cachemeta's answer for the prompt's blocks (empty: place
    without regard to caches); ``common`` the pools holding a prefix too widely held to list
    (the same as listing each). ``local_prefill``: a decode node may prefill the request
    itself where that costs less (``Placement.local``)."""
    local_from = (holders, common) if local_prefill else None
    terms = _Terms(slo_s, tbt_slo_s, avoid, resumed, local_from)
    best = cheapest_prefill(request, view, holders, now, avoid, common)
    if best is None:
        return Rejection("no prefill node is available", cause="no_prefill_node")

    def every_cost() -> list[PrefillCost]:
        return prefill_costs(request, view, holders, now, avoid, common)

    return _finish(request, view, now, best, every_cost, terms)


def place_on(
    request: PlacementRequest,
    view: ClusterView,
    node_id: str,
    local_blocks: int,
    now: float,
    slo_s: float | None = None,
    *,
    tbt_slo_s: float | None = None,
    avoid: Collection[str] = (),
) -> Placement | Rejection:
    """Prefill on ``node_id`` (chosen by some other rule: the benchmarks' baselines), which
    computes all but the ``local_blocks`` its own pool holds and pulls nothing; decode nodes
    and objectives as in ``place``."""
    terms = _Terms(slo_s, tbt_slo_s, avoid, False)
    cost = cost_on_node(request, view, view.nodes[node_id], local_blocks)
    return _finish(request, view, now, cost, lambda: [cost], terms)


def place_round_robin(
    request: PlacementRequest,
    view: ClusterView,
    turn: int,
    now: float,
    slo_s: float | None = None,
    *,
    tbt_slo_s: float | None = None,
    avoid: Collection[str] = (),
    resumed: bool = False,
) -> Placement | Rejection:
    """The cache-oblivious baseline (for benchmarks): the ``turn``-th prefill node in id order
    of those that may take work and are not in ``avoid``, no pulls; decode nodes and
    objectives as in ``place``."""
    terms = _Terms(slo_s, tbt_slo_s, avoid, resumed)
    prefills = sorted(
        (n for n in view.targets("prefill", now) if n.node_id not in avoid),
        key=lambda n: n.node_id,
    )
    if not prefills:
        return Rejection("no prefill node is available", cause="no_prefill_node")
    cost = cost_without_cache(request, view, prefills[turn % len(prefills)])
    return _finish(request, view, now, cost, lambda: [cost], terms)


def objective_applies(wait_s: float, slo_s: float | None = None) -> bool:
    """Whether the TTFT objective may refuse a request its prefill node starts after
    ``wait_s``. It refuses waiting, not compute: a request a node would start at once is let
    in whatever its compute is predicted to take. Refusing it could not make it sooner, and a
    step fit that overestimates (a cold first step, a busy spell of the host) would refuse
    every request and so never see the step that corrects it. An objective already spent
    when the request is placed (``slo_s`` 0: its deadline has passed) no node can meet: it
    refuses whatever the wait."""
    return wait_s > 0 or (slo_s is not None and slo_s <= 0)


def _finish(
    request: PlacementRequest,
    view: ClusterView,
    now: float,
    chosen: PrefillCost,
    all_costs: Callable[[], Sequence[PrefillCost]],
    terms: _Terms,
) -> Placement | Rejection:
    """Checks the TTFT objective for the chosen prefill node, then ranks the decode nodes at
    the time its prefill should end. ``all_costs`` prices every candidate, which only a
    rejection's Retry-After needs."""
    slo_s = None if terms.resumed else terms.ttft_slo_s
    # The objective is checked against the prediction as the node's measured misses stretch it.
    expected_s = chosen.ttft_s * view.calibration.scale(chosen.node_id)
    if slo_s is not None and expected_s > slo_s and objective_applies(chosen.wait_s, slo_s):
        reason = (
            f"The predicted time to first token ({expected_s:.2f} s) exceeds the service "
            f"objective of {slo_s:.2f} s; the servers are overloaded, retry later."
        )
        return Rejection(reason, 429, _retry_after(all_costs(), slo_s), cause="ttft_slo")
    at = now + chosen.ttft_s
    # Only the first few count: the candidates named, and a refusal's reason and retry.
    ranked = best_decodes(request, view, now, at, MAX_DECODE_CANDIDATES, terms.avoid)
    if not ranked:
        return Rejection("no decode node is available", cause="no_decode_node")
    tbt_slo_s = None if terms.resumed else terms.tbt_slo_s
    if tbt_slo_s is not None:
        meeting = [f for f in ranked if _meets(f, tbt_slo_s)]
        if not meeting:
            return _decode_rejection(request, view, ranked, tbt_slo_s)
        ranked = meeting
    if terms.local_from is not None:
        local = _local(request, view, now, chosen, ranked, terms)
        if local is not None:
            return local
    return Placement(
        prefill_node=chosen.node_id,
        decode_nodes=[f.node_id for f in ranked[:MAX_DECODE_CANDIDATES]],
        pulls=chosen.pulls,
        predicted_ttft_s=chosen.ttft_s,
        num_cached_tokens=chosen.cached_tokens,
        predicted_tbt_s=ranked[0].tbt_s,
        placed_at=now,
        predicted_wait_s=chosen.wait_s,
    )


def _local(
    request: PlacementRequest,
    view: ClusterView,
    now: float,
    chosen: PrefillCost,
    ranked: Sequence[DecodeForecast],
    terms: _Terms,
) -> Placement | None:
    """The placement prefilling on a ranked decode node, where that beats ``chosen``."""
    assert terms.local_from is not None
    holders, common = terms.local_from
    tbt_slo_s = None if terms.resumed else terms.tbt_slo_s
    found = choose_local(
        request, view, holders, now, chosen, ranked, tbt_slo_s, terms.avoid, common
    )
    if found is None:
        return None
    local, forecast = found
    cost = local.cost
    return Placement(
        prefill_node=cost.node_id,
        decode_nodes=[cost.node_id],
        pulls=cost.pulls,
        predicted_ttft_s=local.ttft_s,
        num_cached_tokens=cost.cached_tokens,
        predicted_tbt_s=forecast.tbt_s,
        placed_at=now,
        predicted_wait_s=cost.wait_s,
    )


def rank_decodes(forecasts: Sequence[DecodeForecast]) -> list[DecodeForecast]:
    """Best first: the nodes with room by predicted time between tokens (then fewer sequences,
    then id); after them those without room, fewest sequences first (the request would queue
    there rather than fail)."""

    return sorted(forecasts, key=rank_key)


def _meets(f: DecodeForecast, tbt_slo_s: float) -> bool:
    return f.fits and max(f.tbt_s, f.tbt_life_s) <= tbt_slo_s


def _decode_rejection(
    request: PlacementRequest,
    view: ClusterView,
    ranked: Sequence[DecodeForecast],
    tbt_slo_s: float,
) -> Rejection:
    """Every decode node is predicted too slow or too full when the prefill would end
    (``ranked``: the best forecasts, best first)."""
    if any(f.fits for f in ranked):
        cause, what = "tbt_slo", f"a time between tokens over {tbt_slo_s * 1000:.0f} ms"
    else:
        cause, what = "kv_full", "no room for its KV cache"
    # Only the most promising few are forecast again: a refusal must stay cheap under load.
    nodes = [view.nodes[f.node_id] for f in ranked[:MAX_DECODE_CANDIDATES]]
    retry = retry_after(nodes, view, request, ranked[0].at, lambda f: _meets(f, tbt_slo_s))
    reason = (
        f"Every decode node is predicted to have {what} when this request's prefill ends; "
        "the servers are overloaded, retry later."
    )
    return Rejection(reason, 429, retry, cause=cause)


def _retry_after(costs: Sequence[PrefillCost], slo_s: float) -> float:
    """When a retry may fit: a node's TTFT falls about as fast as its queue drains, so it meets
    the objective after its excess over it, or (if the queue alone cannot explain the excess)
    once its queue is empty. At least one second."""
    return max(1.0, min(min(c.ttft_s - slo_s, c.wait_s) for c in costs))


def record_placement(view: ClusterView, placement: Placement, request: PlacementRequest) -> None:
    """Counts the request on its prefill node until that node's next heartbeat, and on its
    first decode node until it is due there (``ClusterView.withdraw(request.request_id)``
    uncounts it if it will not come), and in that node's placement rate (not uncounted)."""
    decode = view.nodes[placement.decode_node]
    view.arrival_rates.add(placement.decode_node, placement.placed_at, request.tbt_slo_s)
    view.record(
        InFlight(
            request_id=request.request_id,
            prefill_node=placement.prefill_node,
            prefill_tokens=request.num_prompt_tokens - placement.num_cached_tokens,
            decode_node=placement.decode_node,
            placed_at=placement.placed_at,
            arrives_at=placement.placed_at + placement.predicted_ttft_s,
            blocks=blocks_needed(decode, request),
            context_tokens=request.num_prompt_tokens,
        )
    )
