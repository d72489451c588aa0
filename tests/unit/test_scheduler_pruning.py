"""Placement on large clusters prices a few nodes found through the view's indexes; on seeded
random clusters it must choose exactly what pricing and forecasting every node chooses.

The clusters mix what makes a node's cost its own (a prefix of its own, measured links, a
step-time fit of its own, a tierd on its host) with plain nodes that differ only by queue,
dead, draining and avoided nodes, a prefix held too widely to list (``CommonPrefix``), and
decode nodes with running, finishing and placed sequences.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

import pytest

from services.scheduler import pricing
from services.scheduler.cluster import ClusterView, CostParams, NodeLoad
from services.scheduler.costs import (
    PlacementRequest,
    PrefillCost,
    cheapest_prefill,
    prefill_costs,
)
from services.scheduler.forecast import forecast
from services.scheduler.policy import Placement, place, record_placement
from services.scheduler.ranking import best_decodes, rank_key
from services.scheduler.timing import StepCoefficients, StepTimes
from shared.cluster_messages import StepSample
from shared.kv.tiers import bandwidth_key
from shared.rpc.types import PrefixHolder

NOW = 500.0
COEF = StepCoefficients(0.01, 1e-3, 1e-7)
DECODE = StepCoefficients(0.02, 2e-4, 3e-7)


class Shared:
    """A common prefix held by a set of pools."""

    def __init__(self, num_blocks: int, ids: Iterable[str]) -> None:
        self.num_blocks = num_blocks
        self.ids = set(ids)

    def holds(self, node_id: str) -> bool:
        return node_id in self.ids

    def ascending(self) -> list[str]:
        return sorted(self.ids)

    def listed(self) -> list[PrefixHolder]:
        return [PrefixHolder(n, "dram", self.num_blocks) for n in self.ascending()]


def prefill_node(rng: random.Random, node_id: str, ids: list[str]) -> NodeLoad:
    measured = rng.random() < 0.15
    peers = rng.sample(ids, min(2, len(ids))) if measured else []
    links = {s: rng.choice((5e8, 4e9)) for s in peers}
    if rng.random() < 0.05:
        links[bandwidth_key("t0", "nvme")] = 3e9
    return NodeLoad(
        node_id=node_id,
        role="prefill",
        queued_tokens=rng.choice((0, 0, 0, 128, 512, 4096)),
        running_seqs=0,
        free_blocks=1000,
        total_blocks=1000,
        block_size=32,
        last_seen=NOW - rng.choice((0.0,) * 12 + (10.0,)),
        draining=rng.random() < 0.03,
        max_num_batched_tokens=rng.choice((0, 0, 0, 512)),
        fetch_bandwidth=links,
        host_id=rng.choice(("", "", "h1", "h2")),
        placed_tokens=rng.choice((0, 0, 64)),
    )


def decode_node(rng: random.Random, node_id: str) -> NodeLoad:
    running = rng.choice((0, 0, 0, 1, 1, 2, 5))
    finishing = tuple(
        (rng.choice((1, 3, 40, 400)), rng.randrange(32, 3000)) for _ in range(running)
    )
    total = 2000
    used = sum(-(-c // 32) for _, c in finishing) + rng.choice((0, 0, 3))
    return NodeLoad(
        node_id=node_id,
        role="decode",
        queued_tokens=0,
        running_seqs=running,
        free_blocks=max(total - used, 0) if rng.random() < 0.95 else 10,
        total_blocks=total,
        block_size=32,
        last_seen=NOW - rng.choice((0.0, 0.0, 0.3, 2.0, 10.0)),
        healthy=rng.random() < 0.97,
        finishing=finishing[: rng.choice((running, running, max(running - 1, 0)))],
    )


def random_cluster(rng: random.Random, prefills: int, decodes: int) -> ClusterView:
    view = ClusterView(
        3.0, timing=StepTimes(COEF, role_priors={"decode": DECODE}), costs=CostParams()
    )
    ids = [f"p{i:03d}" for i in range(prefills)]
    for node_id in ids:
        view.update(prefill_node(rng, node_id, ids))
        if rng.random() < 0.1:  # a node with its own measured speed
            coef = StepCoefficients(rng.uniform(0, 0.02), rng.uniform(1e-4, 2e-3), 1e-7)
            samples = [StepSample(1, n, 0, coef.step_seconds(1, n, 0)) for n in range(1, 2000, 97)]
            view.timing.add(node_id, "prefill", samples)
    for i in range(decodes):
        view.update(decode_node(rng, f"d{i:03d}"))
    view.update(
        NodeLoad("t0", "tierd", 0, 0, 0, 0, 32, NOW, host_id="h1", read_bandwidth={"nvme": 2e9})
    )
    return view


def random_request(rng: random.Random, view: ClusterView, n: int) -> tuple[
    PlacementRequest, list[PrefixHolder], Shared | None
]:  # fmt: skip
    request = PlacementRequest(rng.choice((33, 500, 1500, 4097)), rng.choice((1, 16, 300)), f"r{n}")
    blocks = request.num_prompt_tokens // 32
    pools = sorted(k for k, v in view.nodes.items() if v.role != "tierd")
    holders = [
        PrefixHolder(node_id, rng.choice(("dram", "dram", "nvme")), rng.randrange(1, blocks + 4))
        for node_id in rng.sample(pools, min(len(pools), rng.randrange(6)))
    ]
    if rng.random() < 0.3:
        holders.append(PrefixHolder("t0", rng.choice(("nvme", "s3")), rng.randrange(1, blocks + 4)))
    common = None
    if rng.random() < 0.6:
        common = Shared(rng.randrange(1, 4), rng.sample(pools, int(len(pools) * rng.random())))
    return request, holders, common


def settle(rng: random.Random, view: ClusterView, count: int) -> None:
    """Places some requests first, so loads and arrivals are on the books."""
    for n in range(count):
        request, holders, common = random_request(rng, view, n)
        decision = place(request, view, holders, NOW, common=common)
        if isinstance(decision, Placement):
            record_placement(view, decision, request)


@pytest.mark.parametrize("seed", range(150))
def test_the_indexed_prefill_search_chooses_what_pricing_every_node_chooses(seed: int) -> None:
    rng = random.Random(seed)
    view = random_cluster(rng, rng.choice((1, 3, 20, 120)), rng.choice((1, 4, 30)))
    settle(rng, view, rng.randrange(8))
    for n in range(5):
        request, holders, common = random_request(rng, view, 100 + n)
        avoid = set(rng.sample(sorted(view.nodes), rng.randrange(3)))
        costs = prefill_costs(request, view, holders, NOW, avoid, common)
        chosen = cheapest_prefill(request, view, holders, NOW, avoid, common)
        if not costs:
            assert chosen is None
            continue
        assert chosen == min(costs, key=lambda c: c.rank)
        if common is not None:  # the same as listing every holder of the common prefix
            listed = cheapest_prefill(request, view, holders + common.listed(), NOW, avoid)
            assert listed == chosen


@pytest.mark.parametrize("seed", range(150))
def test_the_indexed_decode_ranking_is_the_head_of_ranking_every_node(seed: int) -> None:
    rng = random.Random(1000 + seed)
    view = random_cluster(rng, 3, rng.choice((1, 3, 20, 120)))
    settle(rng, view, rng.randrange(12))
    for n in range(5):
        request, _, _ = random_request(rng, view, 200 + n)
        at = NOW + rng.choice((0.0, 0.05, 0.5, 3.0))
        avoid = set(rng.sample(sorted(view.nodes), rng.randrange(3)))
        every = [
            forecast(node, view, request, at)
            for node in view.targets("decode", NOW)
            if node.node_id not in avoid
        ]
        k = rng.choice((1, 3, 5))
        assert best_decodes(request, view, NOW, at, k, avoid) == sorted(every, key=rank_key)[:k]


def test_a_changed_step_model_rebuilds_the_decode_index() -> None:
    rng = random.Random(5)
    view = random_cluster(rng, 2, 40)
    request = PlacementRequest(300, 50)
    best_decodes(request, view, NOW, NOW + 1, 3)
    slow = [StepSample(8, 8, 4000, 0.5)] * 32
    for node_id in ("d000", "d001"):
        view.timing.add(node_id, "decode", slow)  # the pooled fit moves for every node
    every = [forecast(node, view, request, NOW + 1) for node in view.targets("decode", NOW)]
    assert best_decodes(request, view, NOW, NOW + 1, 3) == sorted(every, key=rank_key)[:3]


@pytest.fixture
def priced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The nodes ``Pricing.cost_on`` prices from now on, in order."""
    found: list[str] = []
    cost_on = pricing.Pricing.cost_on

    def counting(
        self: pricing.Pricing, node: NodeLoad, model: pricing.Model | None = None
    ) -> PrefillCost:
        found.append(node.node_id)
        return cost_on(self, node, model)

    monkeypatch.setattr(pricing.Pricing, "cost_on", counting)
    return found


def test_many_alike_nodes_cost_a_handful_of_prices(priced: list[str]) -> None:
    view = ClusterView(3.0, timing=StepTimes(COEF))
    for i in range(500):
        view.update(NodeLoad(f"p{i:03d}", "prefill", (i % 5) * 100, 0, 100, 100, 32, NOW))
        view.update(NodeLoad(f"d{i:03d}", "decode", 0, i % 3, 100 - i % 3, 100, 32, NOW))
    request = PlacementRequest(1000, 20)
    common = Shared(1, (f"p{i:03d}" for i in range(0, 500, 2)))
    holders = [PrefixHolder("p377", "dram", 20)]
    decision = place(request, view, holders, NOW, common=common)
    assert isinstance(decision, Placement)
    assert len(priced) <= 4  # the holder, and the first idle nodes of each kind
    every = prefill_costs(request, view, holders, NOW, common=common)
    assert decision.prefill_node == min(every, key=lambda c: c.rank).node_id
    assert decision.decode_nodes == ["d000", "d003", "d006"]


@pytest.mark.parametrize("prompt", [40, 700, 3000])
def test_holders_behind_a_long_run_of_idle_nodes_without_the_prefix(
    prompt: int, priced: list[str]
) -> None:
    """200 idle nodes without the common prefix come first in queue order, its 100 holders
    (all with a queue) after them: the walk passes over the nodes of a kind it priced already,
    without pricing them. Pulls are slow, so a holder wins."""
    view = ClusterView(3.0, timing=StepTimes(COEF), costs=CostParams(default_fetch_bandwidth=1e6))
    for i in range(300):
        queued = 0 if i < 200 else i % 7 + 1
        view.update(NodeLoad(f"p{i:03d}", "prefill", queued, 0, 9, 9, 32, NOW))
    view.update(NodeLoad("d", "decode", 0, 0, 1000, 1000, 32, NOW))
    common = Shared(1, (f"p{i:03d}" for i in range(200, 300)))
    request = PlacementRequest(prompt, 8)
    every = prefill_costs(request, view, [], NOW, common=common)
    del priced[:]
    chosen = cheapest_prefill(request, view, [], NOW, common=common)
    assert chosen == min(every, key=lambda c: c.rank)
    assert chosen is not None and chosen.node_id in common.ids
    assert len(priced) <= 2
