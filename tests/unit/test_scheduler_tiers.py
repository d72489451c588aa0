"""Placement over blocks held below DRAM: tierds' NVMe and S3 tiers as sources of pulls.

The step-time model is 10 ms per step, 1 ms per token and 1e-7 s per unit of attention work.
The break-even bandwidth of a pull is worked out from it in each test: the prompt is
recomputed when fetching its cached blocks would take longer than computing them.
"""

from __future__ import annotations

import pytest

from services.scheduler.config import SchedulerSettings
from services.scheduler.costs import PlacementRequest, prefill_costs
from services.scheduler.policy import (
    ClusterView,
    CostParams,
    NodeLoad,
    Pull,
    Rejection,
    place,
)
from services.scheduler.timing import StepCoefficients, StepTimes, prefill_seconds
from shared.kv.tiers import bandwidth_key, key_tier
from shared.rpc.types import PrefixHolder
from tests.unit.scheduler_nodes import NOW, node, placed

COEF = StepCoefficients(base_s=0.01, per_token_s=1e-3, per_attention_s=1e-7)
BLOCK_BYTES = 32 * 46_080
PROMPT = PlacementRequest(num_prompt_tokens=2048, max_tokens=16)  # 63 cacheable blocks
TIERD = "tierd-h2"
OVERHEAD_S = CostParams().pull_overhead_s
LATENCY_S = {"nvme": 0.001, "s3": 0.02}


def view(*nodes: NodeLoad) -> ClusterView:
    v = ClusterView(3.0, timing=StepTimes(COEF))
    for n in nodes:
        v.update(n)
    return v


def recompute_s() -> float:
    return prefill_seconds(COEF, 2048, 0, 2048)


def after_hit_s(blocks: int) -> float:
    return prefill_seconds(COEF, 2048 - 32 * blocks, 32 * blocks, 2048)


def break_even(tier: str, blocks: int = 63) -> float:
    """The bandwidth at which pulling ``blocks`` from ``tier`` costs what computing does."""
    saved = recompute_s() - after_hit_s(blocks) - OVERHEAD_S - LATENCY_S[tier]
    return blocks * BLOCK_BYTES / saved


@pytest.mark.parametrize("tier", ["s3", "nvme"])
def test_a_tier_is_pulled_from_only_above_the_break_even_bandwidth(tier: str) -> None:
    holders = [PrefixHolder(TIERD, tier, 63)]
    key = bandwidth_key(TIERD, tier)
    fast = 1.05 * break_even(tier)
    v = view(
        node("p", "prefill", host_id="h1", fetch_bandwidth={key: fast}),
        node("d", "decode"),
        node(TIERD, "tierd", host_id="h2"),
    )
    p = placed(place(PROMPT, v, holders, NOW))
    assert (p.prefill_node, p.pulls, p.num_cached_tokens) == (
        "p",
        (Pull(TIERD, 0, 63, tier),),
        2016,
    )
    fetch = OVERHEAD_S + LATENCY_S[tier] + 63 * BLOCK_BYTES / fast
    assert p.predicted_ttft_s == pytest.approx(fetch + after_hit_s(63))
    assert p.predicted_ttft_s < recompute_s()

    slow = 0.95 * break_even(tier)
    v.update(node("p", "prefill", host_id="h1", fetch_bandwidth={key: slow}))
    p = placed(place(PROMPT, v, holders, NOW))
    assert (p.pulls, p.num_cached_tokens) == ((), 0)
    assert p.predicted_ttft_s == pytest.approx(recompute_s())


def test_the_bandwidth_of_a_tier_falls_back_to_what_the_tierd_reads() -> None:
    p = node("p", "prefill", host_id="h1", fetch_bandwidth={"q": 2e9})
    fresh = node("fresh", "prefill", host_id="h1")
    remote = node("tierd-h2", "tierd", host_id="h2", read_bandwidth={"s3": 3e8, "nvme": 5e9})
    local = node("tierd-h1", "tierd", host_id="h1", read_bandwidth={"nvme": 5e9})
    silent = node("tierd-h3", "tierd", host_id="h3")
    v = view(p, remote, local, silent)
    transfer = v.fallback_bandwidth(p)
    assert transfer == 2e9
    assert v.tier_bandwidth(p, "tierd-h2", "s3", transfer) == 3e8  # S3 is the slower
    assert v.tier_bandwidth(p, "tierd-h2", "nvme", transfer) == 2e9  # the network is
    assert v.tier_bandwidth(p, "tierd-h1", "nvme", transfer) == 5e9  # read on its own host
    # Nothing measured: the tier's default, bounded by the transfer layer off the host.
    assert v.tier_bandwidth(p, "tierd-h3", "s3", transfer) == 2.5e8
    assert v.tier_bandwidth(p, "tierd-h3", "nvme", transfer) == 1.5e9
    # A node that measured nothing takes the cluster's links for its transfer layer.
    assert v.tier_bandwidth(fresh, "tierd-h2", "nvme", v.fallback_bandwidth(fresh)) == 2e9
    assert view(fresh, silent).tier_bandwidth(fresh, "tierd-h3", "nvme", 1e9) == 1e9


def test_pulls_from_lower_tiers_do_not_count_as_network_links() -> None:
    p = node("p", "prefill", fetch_bandwidth={"q": 2e9, bandwidth_key("t", "s3"): 1e7})
    fresh = node("fresh", "prefill", fetch_bandwidth={bandwidth_key("t", "nvme"): 1e8})
    v = view(p, fresh)
    assert v.fallback_bandwidth(p) == 2e9
    assert v.fallback_bandwidth(fresh) == 2e9  # the cluster's pool links only


def test_a_placement_prices_a_tier_at_the_tierds_measured_read() -> None:
    v = view(
        node("p", "prefill", host_id="h1"),
        node("d", "decode"),
        node(TIERD, "tierd", host_id="h2", read_bandwidth={"s3": 4e8}),
    )
    [cost] = prefill_costs(PROMPT, v, [PrefixHolder(TIERD, "s3", 63)], NOW)
    assert cost.pulls == (Pull(TIERD, 0, 63, "s3"),)
    assert cost.fetch_s == pytest.approx(OVERHEAD_S + 0.02 + 63 * BLOCK_BYTES / 4e8)


def test_of_several_tiers_of_one_tierd_the_best_priced_is_pulled() -> None:
    holders = [PrefixHolder(TIERD, "nvme", 40), PrefixHolder(TIERD, "s3", 63)]
    tierd = node(TIERD, "tierd", host_id="h2")
    # Defaults: all 63 blocks from S3 at 250 MB/s beat 40 from NVMe and computing the rest.
    v = view(node("p", "prefill"), node("d", "decode"), tierd)
    assert placed(place(PROMPT, v, holders, NOW)).pulls == (Pull(TIERD, 0, 63, "s3"),)
    s3_s = OVERHEAD_S + 0.02 + 63 * BLOCK_BYTES / 2.5e8 + after_hit_s(63)
    nvme_s = OVERHEAD_S + 0.001 + 40 * BLOCK_BYTES / 1e9 + after_hit_s(40)
    assert s3_s < nvme_s < recompute_s()
    slow_s3 = {bandwidth_key(TIERD, "s3"): 5e7}
    v.update(node("p", "prefill", fetch_bandwidth=slow_s3))
    p = placed(place(PROMPT, v, holders, NOW))
    assert (p.pulls, p.num_cached_tokens) == ((Pull(TIERD, 0, 40, "nvme"),), 1280)
    assert p.predicted_ttft_s == pytest.approx(nvme_s)


def test_the_cheapest_source_wins_across_pools_and_tiers() -> None:
    holders = [
        PrefixHolder("peer", "dram", 30),
        PrefixHolder(TIERD, "nvme", 63),
        PrefixHolder(TIERD, "s3", 63),
        PrefixHolder("p", "dram", 10),
    ]
    v = view(
        node("p", "prefill"),
        node("peer", "prefill", queued_tokens=50_000),
        node("d", "decode"),
        node(TIERD, "tierd"),
    )
    p = placed(place(PROMPT, v, holders, NOW))
    # The NVMe copy (1 GB/s, the transfer layer's default) beats the shorter DRAM one.
    assert (p.prefill_node, p.pulls) == ("p", (Pull(TIERD, 10, 53, "nvme"),))
    fetch = OVERHEAD_S + 0.001 + 53 * BLOCK_BYTES / 1e9
    assert p.predicted_ttft_s == pytest.approx(fetch + after_hit_s(63))


def test_a_tierd_is_a_source_never_a_target() -> None:
    tierd = node(TIERD, "tierd")
    assert place(PROMPT, view(tierd, node("d", "decode")), [], NOW) == Rejection(
        "no prefill node is available", 503, cause="no_prefill_node"
    )
    v = view(node("p", "prefill"), node("d", "decode"), tierd, node("gone", "tierd", last_seen=0))
    assert [n.node_id for n in v.sources(NOW)] == ["p", "d", TIERD]
    assert v.targets("tierd", NOW) == [tierd]  # no role asks for tierds as targets


def test_a_late_tierd_stays_a_source_until_its_grace_ends_or_it_disconnects() -> None:
    late = node(TIERD, "tierd", last_seen=NOW - 5)  # past the 3 s timeout, inside the grace
    v = view(
        node("p", "prefill"),
        node("d", "decode"),
        late,
        node("late-p", "prefill", last_seen=NOW - 5),
    )
    assert [n.node_id for n in v.sources(NOW)] == ["p", "d", TIERD]
    holders = [PrefixHolder(TIERD, "nvme", 53)]
    assert placed(place(PROMPT, v, holders, NOW)).pulls == (Pull(TIERD, 0, 53, "nvme"),)
    late.disconnected = True
    assert [n.node_id for n in v.sources(NOW)] == ["p", "d"]
    assert placed(place(PROMPT, v, holders, NOW)).pulls == ()


def test_only_tierds_lower_tiers_and_nodes_pools_can_be_pulled() -> None:
    v = view(
        node("p", "prefill"),
        node("q", "prefill", queued_tokens=50_000),
        node("d", "decode"),
        node(TIERD, "tierd"),
        node("gone", "tierd", last_seen=NOW - 10),
    )
    holders = [
        PrefixHolder(TIERD, "dram", 63),
        PrefixHolder("q", "nvme", 63),
        PrefixHolder("d", "s3", 63),
        PrefixHolder("gone", "s3", 63),
        PrefixHolder("unknown", "nvme", 63),
    ]
    p = placed(place(PROMPT, v, holders, NOW))
    assert (p.prefill_node, p.pulls, p.num_cached_tokens) == ("p", (), 0)
    assert p.predicted_ttft_s == pytest.approx(recompute_s())


def test_an_avoided_tierd_is_not_pulled_from() -> None:
    v = view(node("p", "prefill"), node("d", "decode"), node(TIERD, "tierd"))
    holders = [PrefixHolder(TIERD, "nvme", 63)]
    assert placed(place(PROMPT, v, holders, NOW)).pulls == (Pull(TIERD, 0, 63, "nvme"),)
    assert placed(place(PROMPT, v, holders, NOW, avoid={TIERD})).pulls == ()


def test_the_bandwidth_key_names_a_tierds_tier() -> None:
    assert bandwidth_key("tierd-h1", "nvme") == "tierd-h1-nvme"
    assert bandwidth_key("tierd-h1", "s3") == "tierd-h1-s3"
    assert bandwidth_key("prefill-1", "dram") == "prefill-1"
    with pytest.raises(ValueError, match="disk"):
        bandwidth_key("tierd-h1", "disk")
    assert [key_tier(k) for k in ("tierd-h1-nvme", "tierd-h1-s3", "prefill-1")] == [
        "nvme",
        "s3",
        "dram",
    ]


def test_the_tier_settings_reach_the_cost_model() -> None:
    settings = SchedulerSettings(
        nvme_read_bandwidth=2e9, s3_read_bandwidth=1e8, nvme_latency_ms=0.5, s3_latency_ms=40
    )
    costs = settings.cost_params()
    assert (costs.tier_read_bandwidth("nvme"), costs.tier_read_bandwidth("s3")) == (2e9, 1e8)
    assert (costs.tier_latency_s("nvme"), costs.tier_latency_s("s3")) == (0.0005, 0.04)
    assert costs.tier_latency_s("dram") == 0.0
    defaults = SchedulerSettings().cost_params()
    assert (defaults.nvme_read_bandwidth, defaults.s3_read_bandwidth) == (1.5e9, 2.5e8)
    assert (defaults.nvme_latency_s, defaults.s3_latency_s) == (0.001, 0.02)
