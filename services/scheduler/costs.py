"""The predicted time to first token of a request on each prefill node, and the cheapest node.

For a node the TTFT is queue wait + fetch time of the cached blocks it lacks + prefill time of
the rest. ``prefill_costs`` prices every node that may take the request (the simulator and
the SLO's Retry-After need them all); ``cheapest_prefill`` finds the same winner while pricing
only the nodes that could still beat it, which is what keeps placement fast with many nodes.
Blocks may be pulled from any node still alive, draining or unhealthy ones included. Pure: no
I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.timing import StepCoefficients, prefill_seconds, queue_seconds
from shared.rpc.types import PrefixHolder

#: Only blocks in a live node's DRAM pool (prefill or decode) can be pulled from it for now.
PULLABLE_TIER = "dram"


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What placement needs of a request; ``request_id`` lets its placement be withdrawn."""

    num_prompt_tokens: int
    max_tokens: int
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class Pull:
    """Prompt blocks ``first_block .. first_block + num_blocks - 1`` come from ``node_id``."""

    node_id: str
    first_block: int
    num_blocks: int


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

    @property
    def rank(self) -> tuple[float, int, str]:
        """Lower is better: the TTFT, then the shorter queue, then the lower id."""
        return (self.ttft_s, self.queued_tokens, self.node_id)


@dataclass(frozen=True, slots=True)
class _HolderGroup:
    """The source nodes holding exactly ``num_blocks`` usable leading blocks."""

    num_blocks: int
    node_ids: list[str]  # sorted
    members: frozenset[str]


class _Model:
    """Prefill and queue times of one step-time model (coefficients, tokens per step, block
    size) for one request, memoized: many nodes share a model. Invariant: every memo entry
    equals what ``prefill_seconds`` / ``queue_seconds`` give for its key."""

    __slots__ = ("block_size", "coef", "fastest_held", "prompt", "step", "times", "waits")

    def __init__(self, coef: StepCoefficients, step: int, block_size: int, prompt: int) -> None:
        self.coef, self.step, self.block_size, self.prompt = coef, step, block_size, prompt
        self.times: dict[int, float] = {}  # cached blocks -> prefill seconds
        self.waits: dict[int, float] = {}  # queued tokens -> seconds
        self.fastest_held: dict[int, float] = {}  # limit -> least prefill over the holders

    def compute_s(self, blocks: int) -> float:
        seconds = self.times.get(blocks)
        if seconds is None:
            cached = blocks * self.block_size
            seconds = prefill_seconds(self.coef, self.prompt - cached, cached, self.step)
            self.times[blocks] = seconds
        return seconds

    def wait_s(self, queued_tokens: int) -> float:
        seconds = self.waits.get(queued_tokens)
        if seconds is None:
            seconds = self.waits[queued_tokens] = queue_seconds(self.coef, queued_tokens, self.step)
        return seconds


class _Pricing:
    """What one placement shares between the nodes it prices: the usable cached prefixes, the
    holders grouped by length, and one memoized ``_Model`` per distinct step-time model."""

    __slots__ = ("_models", "cached", "groups", "request", "view")

    def __init__(
        self,
        request: PlacementRequest,
        view: ClusterView,
        holders: Iterable[PrefixHolder],
        prefills: Sequence[NodeLoad],
        sources: Iterable[NodeLoad] = (),
    ) -> None:
        self.request, self.view = request, view
        # Decode nodes serve pins too: they hold a chat's generated history.
        self.cached = _pullable(holders, {n.node_id for n in sources})
        self.groups = _holder_groups(self.cached, request, prefills)
        self._models: dict[tuple[StepCoefficients, int, int], _Model] = {}

    def model(self, node: NodeLoad) -> _Model:
        coef = self.view.timing.coefficients(node.node_id, "prefill")
        step = node.max_num_batched_tokens or self.view.costs.max_num_batched_tokens
        key = (coef, step, node.block_size)
        found = self._models.get(key)
        if found is None:
            found = _Model(coef, step, node.block_size, self.request.num_prompt_tokens)
            self._models[key] = found
        return found

    def limit(self, node: NodeLoad) -> int:
        """Blocks of the prompt a hit may cover on ``node``: the last token is always computed."""
        return max(self.request.num_prompt_tokens - 1, 0) // node.block_size

    def lower_bound(self, node: NodeLoad, model: _Model) -> float:
        """No TTFT on ``node`` is below this: its queue wait plus the least prefill time any
        cached prefix on offer gives (a pull's fetch time is left out). It holds whatever
        shape the fitted model has."""
        limit = self.limit(node)
        held = model.fastest_held.get(limit)
        if held is None:
            held = min(
                (model.compute_s(min(g.num_blocks, limit)) for g in self.groups),
                default=float("inf"),
            )
            model.fastest_held[limit] = held
        local = min(self.cached.get(node.node_id, 0), limit)
        wait = model.wait_s(node.queued_tokens + node.placed_tokens)
        return wait + min(held, model.compute_s(local))

    def cost_on(self, node: NodeLoad, model: _Model | None = None) -> PrefillCost:
        """Computes what ``node`` lacks, or pulls it from the holder that makes this cheapest."""
        model = model or self.model(node)
        bs, limit, view = node.block_size, self.limit(node), self.view
        local = min(self.cached.get(node.node_id, 0), limit)
        best: tuple[float, float, int, tuple[Pull, ...]] = (model.compute_s(local), 0.0, local, ())
        for remote, source, bandwidth in _sources(node, self.groups, limit, local, view):
            missing_bytes = (remote - local) * view.block_bytes(node)
            fetch = view.costs.pull_overhead_s + missing_bytes / bandwidth
            compute = model.compute_s(remote)
            if fetch + compute < best[0] + best[1]:
                best = (compute, fetch, remote, (Pull(source, local, remote - local),))
        compute, fetch, blocks, pulls = best
        queued = node.queued_tokens + node.placed_tokens
        return PrefillCost(
            node_id=node.node_id,
            wait_s=model.wait_s(queued),
            fetch_s=fetch,
            compute_s=compute,
            cached_blocks=blocks,
            cached_tokens=blocks * bs,
            pulls=pulls,
            queued_tokens=queued,
        )

    def cheapest(self, prefills: Sequence[NodeLoad]) -> PrefillCost | None:
        """The node of lowest ``rank``, pricing in full only the nodes whose lower bound does
        not exceed the best TTFT found so far."""
        bounds = []
        for node in prefills:
            model = self.model(node)
            queued = node.queued_tokens + node.placed_tokens
            bounds.append((self.lower_bound(node, model), queued, node.node_id, node, model))
        bounds.sort(key=lambda b: b[:3])
        best: PrefillCost | None = None
        for bound, _, _, node, model in bounds:
            # A tie in TTFT is broken by queue and id, so only a strictly larger bound stops.
            if best is not None and bound > best.ttft_s:
                break
            cost = self.cost_on(node, model)
            if best is None or cost.rank < best.rank:
                best = cost
        return best


def prefill_costs(
    request: PlacementRequest,
    view: ClusterView,
    holders: Sequence[PrefixHolder],
    now: float,
    avoid: Collection[str] = (),
) -> list[PrefillCost]:
    """The cost of ``request`` on every prefill node that may take it and is not in ``avoid``
    (nodes in ``avoid`` are not pulled from either: they just failed to answer)."""
    prefills, sources = _candidates(view, now, avoid)
    pricing = _Pricing(request, view, holders, prefills, sources)
    return [pricing.cost_on(node) for node in prefills]


def cheapest_prefill(
    request: PlacementRequest,
    view: ClusterView,
    holders: Sequence[PrefixHolder],
    now: float,
    avoid: Collection[str] = (),
) -> PrefillCost | None:
    """``min(prefill_costs(...), key=rank)`` without pricing every node; None when no prefill
    node may take the request."""
    prefills, sources = _candidates(view, now, avoid)
    return _Pricing(request, view, holders, prefills, sources).cheapest(prefills)


def _candidates(
    view: ClusterView, now: float, avoid: Collection[str]
) -> tuple[list[NodeLoad], list[NodeLoad]]:
    """The prefill nodes that may take work and the nodes that may be pulled from."""
    prefills = [n for n in view.targets("prefill", now) if n.node_id not in avoid]
    sources = [n for n in view.sources(now) if n.node_id not in avoid]
    return prefills, sources


def cost_without_cache(request: PlacementRequest, view: ClusterView, node: NodeLoad) -> PrefillCost:
    """The cost on ``node`` computing the whole prompt (the cache-oblivious baseline)."""
    return _Pricing(request, view, (), (node,)).cost_on(node)


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


def _pullable(holders: Iterable[PrefixHolder], sources: set[str]) -> dict[str, int]:
    """Leading blocks each source node holds in its pool."""
    cached: dict[str, int] = {}
    for h in holders:
        if h.tier == PULLABLE_TIER and h.node_id in sources and h.num_blocks > 0:
            cached[h.node_id] = max(cached.get(h.node_id, 0), h.num_blocks)
    return cached


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
