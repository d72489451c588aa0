"""Fetch or recompute: with measured bandwidths just either side of the break-even point.

A pull of the blocks ``local .. remote - 1`` from a tierd's tier pays off when

    pull overhead + tier latency + (remote - local) * block bytes / bandwidth
        < prefill(prompt after local blocks) - prefill(prompt after remote blocks)

so the break-even bandwidth is the missing bytes over the saving, less the fixed costs. Every
term comes from the cost model's own parameters and ``prefill_seconds``; each test prices the
same prompt at a bandwidth a thousandth above and a thousandth below that point.
"""

from __future__ import annotations

import pytest

from services.scheduler.costs import prefill_costs
from services.scheduler.policy import (
    ClusterView,
    CostParams,
    NodeLoad,
    Placement,
    PlacementRequest,
    Pull,
    place,
)
from services.scheduler.timing import StepCoefficients, StepTimes, prefill_seconds
from shared.kv.tiers import bandwidth_key
from shared.rpc.types import PrefixHolder
from tests.unit.scheduler_nodes import NOW, node

COEF = StepCoefficients(base_s=0.01, per_token_s=1e-3, per_attention_s=1e-7)
COSTS = CostParams()
BLOCK_BYTES = COSTS.default_block_bytes
PROMPT = PlacementRequest(num_prompt_tokens=2048, max_tokens=16)
BLOCKS = 63  # (2048 - 1) // 32: the last token is always computed
TIERD = "tierd-h2"
ABOVE, BELOW = 1.001, 0.999
TIERS = ("nvme", "s3")


def cluster(prefill: NodeLoad, tierd: NodeLoad) -> ClusterView:
    v = ClusterView(3.0, timing=StepTimes(COEF), costs=COSTS)
    for n in (prefill, node("d", "decode"), tierd):
        v.update(n)
    return v


def compute_s(cached_blocks: int) -> float:
    cached = 32 * cached_blocks
    return prefill_seconds(
        COEF, PROMPT.num_prompt_tokens - cached, cached, COSTS.max_num_batched_tokens
    )


def fetch_s(tier: str, blocks: int, bandwidth: float) -> float:
    fixed = COSTS.pull_overhead_s + COSTS.tier_latency_s(tier)
    return fixed + blocks * BLOCK_BYTES / bandwidth


def break_even(tier: str, local: int = 0) -> float:
    """The bandwidth at which pulling the blocks ``local`` lacks costs what computing them does."""
    saved = compute_s(local) - compute_s(BLOCKS)
    fixed = COSTS.pull_overhead_s + COSTS.tier_latency_s(tier)
    assert saved > fixed  # else no bandwidth could make the pull pay
    return (BLOCKS - local) * BLOCK_BYTES / (saved - fixed)


def plan(prefill: NodeLoad, tierd: NodeLoad, holders: list[PrefixHolder]) -> Placement:
    decision = place(PROMPT, cluster(prefill, tierd), holders, NOW)
    assert isinstance(decision, Placement), decision
    return decision


def measured(tier: str, bandwidth: float) -> NodeLoad:
    """Prefill node ``p``, off the tierd's host, having measured its pulls from ``tier``."""
    return node(
        "p", "prefill", host_id="h1", fetch_bandwidth={bandwidth_key(TIERD, tier): bandwidth}
    )


def assert_pulls(p: Placement, tier: str, local: int, bandwidth: float) -> None:
    assert p.pulls == (Pull(TIERD, local, BLOCKS - local, tier),)
    assert p.num_cached_tokens == 32 * BLOCKS
    want = fetch_s(tier, BLOCKS - local, bandwidth) + compute_s(BLOCKS)
    assert p.predicted_ttft_s == pytest.approx(want, rel=1e-9)
    assert p.predicted_ttft_s < compute_s(local)


def assert_recomputes(p: Placement, local: int) -> None:
    assert (p.pulls, p.num_cached_tokens) == ((), 32 * local)
    assert p.predicted_ttft_s == pytest.approx(compute_s(local), rel=1e-9)


@pytest.mark.parametrize("tier", TIERS)
def test_a_tierd_tier_measured_fast_enough_is_pulled_from_else_the_prompt_is_computed(
    tier: str,
) -> None:
    holders = [PrefixHolder(TIERD, tier, BLOCKS)]
    tierd = node(TIERD, "tierd", host_id="h2")
    fast, slow = ABOVE * break_even(tier), BELOW * break_even(tier)
    assert_pulls(plan(measured(tier, fast), tierd, holders), tier, 0, fast)
    assert_recomputes(plan(measured(tier, slow), tierd, holders), 0)


@pytest.mark.parametrize("tier", TIERS)
def test_the_break_even_counts_only_the_blocks_the_node_lacks(tier: str) -> None:
    local = 20
    holders = [PrefixHolder("p", "dram", local), PrefixHolder(TIERD, tier, BLOCKS)]
    tierd = node(TIERD, "tierd", host_id="h2")
    # Fewer blocks to fetch and less to save: another point than the whole prompt's.
    assert break_even(tier, local) != pytest.approx(break_even(tier))
    fast, slow = ABOVE * break_even(tier, local), BELOW * break_even(tier, local)
    assert_pulls(plan(measured(tier, fast), tierd, holders), tier, local, fast)
    assert_recomputes(plan(measured(tier, slow), tierd, holders), local)


@pytest.mark.parametrize("tier", TIERS)
def test_unmeasured_by_the_node_the_tierds_measured_read_decides(tier: str) -> None:
    holders = [PrefixHolder(TIERD, tier, BLOCKS)]
    # The node's links to peers' pools are far faster: the tier's read is what bounds the pull.
    prefill = node("p", "prefill", host_id="h1", fetch_bandwidth={"peer": 1e12})
    fast, slow = ABOVE * break_even(tier), BELOW * break_even(tier)
    fast_read = node(TIERD, "tierd", host_id="h2", read_bandwidth={tier: fast})
    assert_pulls(plan(prefill, fast_read, holders), tier, 0, fast)
    slow_read = node(TIERD, "tierd", host_id="h2", read_bandwidth={tier: slow})
    assert_recomputes(plan(prefill, slow_read, holders), 0)


@pytest.mark.parametrize("tier", TIERS)
def test_the_nodes_own_measurement_overrules_the_tierds_read(tier: str) -> None:
    holders = [PrefixHolder(TIERD, tier, BLOCKS)]
    fast, slow = ABOVE * break_even(tier), BELOW * break_even(tier)
    quick_read = node(TIERD, "tierd", host_id="h2", read_bandwidth={tier: 1e12})
    assert_recomputes(plan(measured(tier, slow), quick_read, holders), 0)
    slow_read = node(TIERD, "tierd", host_id="h2", read_bandwidth={tier: 1.0})
    assert_pulls(plan(measured(tier, fast), slow_read, holders), tier, 0, fast)


@pytest.mark.parametrize("tier", TIERS)
def test_every_node_is_priced_on_the_same_side_of_the_point(tier: str) -> None:
    # prefill_costs (the simulator's and Retry-After's view) agrees with the pruned search.
    holders = [PrefixHolder(TIERD, tier, BLOCKS)]
    tierd = node(TIERD, "tierd", host_id="h2")
    fast, slow = ABOVE * break_even(tier), BELOW * break_even(tier)
    [cost] = prefill_costs(PROMPT, cluster(measured(tier, fast), tierd), holders, NOW)
    assert (cost.pulls, cost.cached_blocks) == ((Pull(TIERD, 0, BLOCKS, tier),), BLOCKS)
    assert cost.fetch_s == pytest.approx(fetch_s(tier, BLOCKS, fast), rel=1e-9)
    assert cost.compute_s == pytest.approx(compute_s(BLOCKS), rel=1e-9)
    [cost] = prefill_costs(PROMPT, cluster(measured(tier, slow), tierd), holders, NOW)
    assert (cost.pulls, cost.cached_blocks, cost.fetch_s) == ((), 0, 0.0)
    assert cost.compute_s == pytest.approx(compute_s(0), rel=1e-9)
