"""The pruned search for the cheapest prefill node against pricing every node.

``place`` prices only the nodes whose lower bound can still win; on random clusters (queues,
measured step times, links, cached prefixes in pools and in tierds' NVMe and S3, ties) it must
choose exactly what the exhaustive minimum over ``prefill_costs`` chooses, pulls and predicted
TTFT included.
"""

from __future__ import annotations

import random

import pytest

from services.scheduler.cluster import ClusterView, CostParams, NodeLoad
from services.scheduler.costs import PlacementRequest, cheapest_prefill, prefill_costs
from services.scheduler.policy import Placement, place
from services.scheduler.timing import StepCoefficients, StepTimes
from shared.cluster_messages import StepSample
from shared.kv.tiers import bandwidth_key
from shared.rpc.types import TIERS, PrefixHolder

NOW = 50.0
TIERDS = ("t0", "t1", "t2")
HOSTS = ("h0", "h1", "")


def tier_links(rng: random.Random) -> dict[str, float]:
    """What a prefill node measured pulling from some tierds' tiers."""
    keys = [bandwidth_key(t, tier) for t in TIERDS for tier in ("nvme", "s3")]
    return {k: rng.choice((1e7, 2e8, 2e9)) for k in rng.sample(keys, rng.randrange(3))}


def add_tierds(rng: random.Random, view: ClusterView) -> None:
    for tierd in TIERDS:
        read = {
            t: rng.choice((5e7, 3e8, 3e9)) for t in rng.sample(("nvme", "s3"), rng.randrange(3))
        }
        view.update(
            NodeLoad(
                tierd, "tierd", 0, 0, 0, 0, 32, NOW - rng.choice((0.0, 0.0, 10.0)),
                host_id=rng.choice(HOSTS), read_bandwidth=read,
            )
        )  # fmt: skip


def random_cluster(rng: random.Random, num_prefill: int) -> ClusterView:
    view = ClusterView(
        3.0, timing=StepTimes(StepCoefficients(0.01, 1e-3, 1e-7)), costs=CostParams()
    )
    ids = [f"p{i:02d}" for i in range(num_prefill)]
    for node_id in ids:
        links = {
            s: rng.choice((5e8, 1e9, 4e9)) for s in rng.sample(ids, min(len(ids), rng.randrange(4)))
        }
        view.update(
            NodeLoad(
                node_id=node_id,
                role="prefill",
                queued_tokens=rng.choice((0, 0, 256, 512, 4096)),
                running_seqs=0,
                free_blocks=1000,
                total_blocks=1000,
                block_size=32,
                last_seen=NOW - rng.choice((0.0, 0.0, 0.0, 10.0)),  # some are dead
                max_num_batched_tokens=rng.choice((0, 512, 2048)),
                fetch_bandwidth=links | tier_links(rng),
                host_id=rng.choice(HOSTS),
            )
        )
        if rng.random() < 0.3:  # a node with its own measured speed
            coef = StepCoefficients(rng.uniform(0, 0.02), rng.uniform(1e-4, 2e-3), 1e-7)
            samples = [StepSample(1, n, 0, coef.step_seconds(1, n, 0)) for n in range(1, 2000, 97)]
            view.timing.add(node_id, "prefill", samples)
    view.update(NodeLoad("d", "decode", 0, 0, 10_000, 10_000, 32, NOW))
    add_tierds(rng, view)
    return view


def random_holders(rng: random.Random, view: ClusterView, prompt_blocks: int) -> list[PrefixHolder]:
    holders = []
    for node_id in rng.sample(sorted(view.nodes), min(len(view.nodes), rng.randrange(12))):
        # Every combination comes, the ones nobody can pull from (a tierd's DRAM) included.
        for tier in rng.sample(TIERS, rng.randrange(1, 3)):
            holders.append(PrefixHolder(node_id, tier, rng.randrange(1, prompt_blocks + 8)))
    return holders


@pytest.mark.parametrize("seed", range(300))
def test_the_pruned_search_chooses_what_pricing_every_node_chooses(seed: int) -> None:
    rng = random.Random(seed)
    view = random_cluster(rng, rng.choice((1, 2, 5, 16, 64)))
    request = PlacementRequest(rng.choice((1, 31, 33, 500, 4097)), 16)
    holders = random_holders(rng, view, request.num_prompt_tokens // 32)
    costs = prefill_costs(request, view, holders, NOW)
    chosen = cheapest_prefill(request, view, holders, NOW)
    if not costs:
        assert chosen is None
        return
    assert chosen == min(costs, key=lambda c: c.rank)
    placement = place(request, view, holders, NOW)
    assert isinstance(placement, Placement)
    assert (placement.prefill_node, placement.pulls) == (chosen.node_id, chosen.pulls)
    assert placement.predicted_ttft_s == chosen.ttft_s


def test_equal_costs_go_to_the_shorter_queue_then_the_lower_id() -> None:
    rng = random.Random(7)
    view = random_cluster(rng, 0)
    for node_id in ("b", "a", "c"):
        view.update(NodeLoad(node_id, "prefill", 0, 0, 100, 100, 32, NOW))
    chosen = cheapest_prefill(PlacementRequest(100, 8), view, [], NOW)
    assert chosen is not None and chosen.node_id == "a"
