"""The predicted time to first token of one request on one prefill node, by part.

For a node the TTFT is queue wait + fetch time of the cached blocks it lacks + prefill time of
the rest; ``Pricing`` holds what the nodes priced for one placement share (the usable cached
prefixes, grouped by length, and the memoized step-time models). ``costs.py`` decides which
nodes to price. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from services.scheduler.cluster import TIERD, ClusterView, NodeLoad
from services.scheduler.sources import (
    CommonMembers,
    CommonPrefix,
    HolderGroup,
    holder_groups,
    options,
    pullable,
)
from services.scheduler.timing import StepCoefficients, prefill_seconds, queue_seconds
from shared.kv.tiers import DRAM
from shared.rpc.types import PrefixHolder

_POOLS = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    """What placement needs of a request; ``request_id`` lets its placement be withdrawn;
    ``tbt_slo_s`` is the time between tokens it is placed under (None: none)."""

    num_prompt_tokens: int
    max_tokens: int
    request_id: str = ""
    tbt_slo_s: float | None = None


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


class Model:
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


def pulled_from(node: NodeLoad, view: ClusterView, now: float) -> bool:
    """Whether blocks may be pulled from ``node``: a live pool or tierd."""
    return (node.role in _POOLS or node.role == TIERD) and view.source_alive(node, now)


#: The best way to a node's cached prefix: (compute s, fetch s, cached blocks, pulls).
Option = tuple[float, float, int, tuple[Pull, ...]]


class Pricing:
    """What one placement shares between the nodes it prices: the usable cached prefixes (the
    holders listed, and a ``CommonPrefix``), the holders grouped by length on ``block_size``,
    and one memoized ``Model`` per distinct step-time model. Holders that are not live or are
    to be avoided are left out."""

    __slots__ = ("_models", "cached", "common", "groups", "request", "view")

    def __init__(
        self,
        request: PlacementRequest,
        view: ClusterView,
        holders: Iterable[PrefixHolder],
        now: float,
        block_size: int | None,
        avoid: Collection[str] = (),
        common: CommonPrefix | None = None,
    ) -> None:
        self.request, self.view = request, view
        nodes = view.nodes
        # Decode nodes serve pins too (a chat's generated history), and tierds their tiers.
        sources = {
            h.node_id: n
            for h in holders
            if (n := nodes.get(h.node_id)) is not None
            and h.node_id not in avoid
            and pulled_from(n, view, now)
        }
        self.cached = pullable(holders, sources)
        self.common = common if common is not None and common.num_blocks > 0 else None
        members = None
        if self.common is not None:
            members = self._with_common(self.common, now, avoid)
        self.groups: list[HolderGroup] = []
        if block_size is not None and (self.cached or members is not None):
            limit = max(request.num_prompt_tokens - 1, 0) // block_size
            self.groups = holder_groups(self.cached, limit, members)
        self._models: dict[tuple[StepCoefficients, int, int], Model] = {}

    def _with_common(
        self, common: CommonPrefix, now: float, avoid: Collection[str]
    ) -> CommonMembers:
        """Raises the listed pools to the common prefix where they hold it, and the members
        of it left to find lazily: the live pools not listed and not to be avoided."""
        listed = set()
        for key, count in list(self.cached.items()):
            if key[1] != DRAM:
                continue
            listed.add(key[0])
            if count < common.num_blocks and common.holds(key[0]):
                self.cached[key] = common.num_blocks
        nodes, view = self.view.nodes, self.view

        def accept(node_id: str) -> bool:
            node = nodes.get(node_id)
            return (
                node is not None
                and node_id not in listed
                and node_id not in avoid
                and node.role in _POOLS
                and view.alive(node, now)
            )

        return CommonMembers(common, accept)

    def model(self, node: NodeLoad) -> Model:
        coef = self.view.timing.coefficients(node.node_id, "prefill")
        step = node.max_num_batched_tokens or self.view.costs.max_num_batched_tokens
        return self.model_of(coef, step, node.block_size)

    def model_of(self, coef: StepCoefficients, step: int, block_size: int) -> Model:
        key = (coef, step, block_size)
        found = self._models.get(key)
        if found is None:
            found = Model(coef, step, block_size, self.request.num_prompt_tokens)
            self._models[key] = found
        return found

    def limit(self, node: NodeLoad) -> int:
        """Blocks of the prompt a hit may cover on ``node``: the last token is always computed."""
        return max(self.request.num_prompt_tokens - 1, 0) // node.block_size

    def lower_bound(self, node: NodeLoad, model: Model) -> float:
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
        held = self.cached.get((node.node_id, DRAM))
        if held is None:
            common = self.common
            held = common.num_blocks if common is not None and common.holds(node.node_id) else 0
        return min(held, limit)

    def best_option(self, node: NodeLoad, model: Model, local: int) -> Option:
        """Computing what ``node`` lacks beyond its ``local`` blocks, or pulling first from the
        holder that makes this cheapest."""
        limit = self.limit(node)
        best: Option = (model.compute_s(local), 0.0, local, ())
        for remote, source, tier, fetch in options(node, self.groups, limit, local, self.view):
            compute = model.compute_s(remote)
            if fetch + compute < best[0] + best[1]:
                best = (compute, fetch, remote, (Pull(source, local, remote - local, tier),))
        return best

    def cost_on(self, node: NodeLoad, model: Model | None = None) -> PrefillCost:
        """Computes what ``node`` lacks, or pulls it from the holder that makes this cheapest."""
        model = model or self.model(node)
        local = self.local(node, self.limit(node))
        compute, fetch, blocks, pulls = self.best_option(node, model, local)
        queued = node.queued_tokens + node.placed_tokens
        return PrefillCost(
            node_id=node.node_id,
            wait_s=model.wait_s(queued),
            fetch_s=fetch,
            compute_s=compute,
            cached_blocks=blocks,
            cached_tokens=blocks * node.block_size,
            pulls=pulls,
            queued_tokens=queued,
        )
