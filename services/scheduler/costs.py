"""The predicted time to first token of a request on each prefill node, and the cheapest node.

For a node the TTFT is queue wait + fetch time of the cached blocks it lacks + prefill time of
the rest. ``prefill_costs`` prices every node that may take the request (the simulator and
the SLO's Retry-After need them all); ``cheapest_prefill`` finds the same winner while pricing
only the nodes that could still beat it, which is what keeps placement fast with many nodes.
Blocks may be pulled from any node still alive, draining or unhealthy ones included, and from
any live tierd's NVMe or S3 tier (``sources.py`` prices each pull). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.sources import HolderGroup, holder_groups, options, pullable
from services.scheduler.timing import StepCoefficients, prefill_seconds, queue_seconds
from shared.kv.tiers import DRAM
from shared.rpc.types import PrefixHolder


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What placement needs of a request; ``request_id`` lets its placement be withdrawn."""

    num_prompt_tokens: int
    max_tokens: int
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class Pull:
    """Prompt blocks ``first_block .. first_block + num_blocks - 1`` come from ``node_id``'s
    ``tier``: a node's pool (``dram``) or a tierd's ``nvme`` or ``s3``."""

    node_id: str
    first_block: int
    num_blocks: int
    tier: str = DRAM


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
        # Decode nodes serve pins too (a chat's generated history), and tierds their tiers.
        self.cached = pullable(holders, {n.node_id: n for n in sources})
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
        local = self.local(node, limit)
        wait = model.wait_s(node.queued_tokens + node.placed_tokens)
        return wait + min(held, model.compute_s(local))

    def local(self, node: NodeLoad, limit: int) -> int:
        """Leading blocks of the prompt ``node``'s own pool holds (usable ones)."""
        return min(self.cached.get((node.node_id, DRAM), 0), limit)

    def cost_on(self, node: NodeLoad, model: _Model | None = None) -> PrefillCost:
        """Computes what ``node`` lacks, or pulls it from the holder that makes this cheapest."""
        model = model or self.model(node)
        bs, limit = node.block_size, self.limit(node)
        local = self.local(node, limit)
        best: tuple[float, float, int, tuple[Pull, ...]] = (model.compute_s(local), 0.0, local, ())
        for remote, source, tier, fetch in options(node, self.groups, limit, local, self.view):
            compute = model.compute_s(remote)
            if fetch + compute < best[0] + best[1]:
                best = (compute, fetch, remote, (Pull(source, local, remote - local, tier),))
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
    cached: dict[tuple[str, str], int], request: PlacementRequest, prefills: Sequence[NodeLoad]
) -> list[HolderGroup]:
    """The holders by usable length, for the prompt's blocks on the prefill nodes' block size."""
    if not cached or not prefills:
        return []
    limit = max(request.num_prompt_tokens - 1, 0) // prefills[0].block_size
    return holder_groups(cached, limit)
