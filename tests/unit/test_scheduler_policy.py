"""The scheduler's placement policy on hand-built cluster views.

Most views use a step-time model of 10 ms per step plus 1 ms per token and no attention cost,
so expected times are easy to work out: computing a 32-token block costs 32 ms, while pulling
it (1,474,560 bytes at 1 GB/s) costs 1.5 ms.
"""

from __future__ import annotations

import random

import pytest

from services.scheduler.policy import (
    ClusterView,
    CostParams,
    NodeLoad,
    Placement,
    PlacementRequest,
    Pull,
    Rejection,
    place,
    place_round_robin,
    prefill_costs,
    record_placement,
)
from services.scheduler.timing import StepCoefficients, StepTimes, prefill_seconds
from shared.cluster_messages import StepSample
from shared.rpc.types import PrefixHolder
from tests.unit.scheduler_nodes import NOW, node

COEF = StepCoefficients(base_s=0.01, per_token_s=1e-3, per_attention_s=0.0)
SMALL = PlacementRequest(num_prompt_tokens=64, max_tokens=64)  # 4 blocks of 32
LONG = PlacementRequest(num_prompt_tokens=2000, max_tokens=16)  # 62 cacheable blocks
BLOCK_BYTES = 32 * 46_080


def view(*nodes: NodeLoad, coef: StepCoefficients = COEF, **costs: object) -> ClusterView:
    v = ClusterView(3.0, timing=StepTimes(coef), costs=CostParams(**costs))  # type: ignore[arg-type]
    for n in nodes:
        v.update(n)
    return v


def dram(node_id: str, blocks: int) -> PrefixHolder:
    return PrefixHolder(node_id, "dram", blocks)


def placed(decision: Placement | Rejection) -> Placement:
    assert isinstance(decision, Placement), decision
    return decision


def test_picks_the_least_loaded_nodes() -> None:
    v = view(
        node("p1", "prefill", queued_tokens=500),
        node("p2", "prefill", queued_tokens=20),
        node("d1", "decode", running_seqs=3),
        node("d2", "decode", running_seqs=1),
    )
    p = placed(place(SMALL, v, [], NOW))
    assert (p.prefill_node, p.decode_node, p.pulls, p.num_cached_tokens) == ("p2", "d2", (), 0)
    # 20 queued tokens, then the 64 of the prompt: two steps of 10 ms plus 1 ms per token.
    assert p.predicted_ttft_s == pytest.approx(0.01 + 0.020 + 0.01 + 0.064)
    assert p.predicted_wait_s == pytest.approx(0.01 + 0.020)  # until the queue reaches it


def test_nodes_without_a_recent_heartbeat_or_draining_are_skipped() -> None:
    v = view(
        node("p1", "prefill", last_seen=NOW - 10),
        node("p2", "prefill", queued_tokens=900),
        node("d1", "decode", draining=True),
        node("d2", "decode", running_seqs=50),
    )
    p = placed(place(SMALL, v, [dram("p1", 1)], NOW))
    assert (p.prefill_node, p.decode_node, p.pulls) == ("p2", "d2", ())


def test_no_live_node_of_a_role_is_a_503() -> None:
    assert place(SMALL, view(node("d1", "decode")), [], NOW) == Rejection(
        "no prefill node is available", 503, cause="no_prefill_node"
    )
    decision = place(SMALL, view(node("p1", "prefill"), node("d", "decode", last_seen=0)), [], NOW)
    assert isinstance(decision, Rejection) and decision.status == 503
    assert decision.cause == "no_decode_node"


def test_a_remote_prefix_is_pulled_when_that_is_cheaper() -> None:
    v = view(
        node("p1", "prefill", fetch_bandwidth={"p2": 2e9}, block_bytes=1_000_000),
        node("p2", "prefill", queued_tokens=5000),
        node("d", "decode"),
    )
    ask = PlacementRequest(num_prompt_tokens=1000, max_tokens=8)
    p = placed(place(ask, v, [dram("p2", 20), dram("p1", 5)], NOW))
    # p1 holds blocks 0-4 itself and pulls 5-19 from p2, then computes 1000 - 640 tokens.
    assert (p.prefill_node, p.pulls, p.num_cached_tokens) == ("p1", (Pull("p2", 5, 15),), 640)
    fetch = 0.002 + 15 * 1_000_000 / 2e9
    assert p.predicted_ttft_s == pytest.approx(fetch + 0.01 + 0.360)


def test_a_prefix_cached_on_a_busy_node_is_pulled_by_an_idle_one() -> None:
    # The acceptance case: the prompt is cached on A, load forces it onto B, B pulls from A.
    v = view(node("A", "prefill", queued_tokens=20_000), node("B", "prefill"), node("d", "decode"))
    p = placed(place(LONG, v, [dram("A", 62)], NOW))
    assert (p.prefill_node, p.pulls, p.num_cached_tokens) == ("B", (Pull("A", 0, 62),), 1984)
    fetch = 0.002 + 62 * BLOCK_BYTES / 1e9
    assert p.predicted_ttft_s == pytest.approx(fetch + 0.01 + 0.016)


def test_no_pull_over_a_terrible_link() -> None:
    v = view(
        node("A", "prefill", queued_tokens=20_000),
        node("B", "prefill", fetch_bandwidth={"A": 1e6}),
        node("d", "decode"),
    )
    p = placed(place(LONG, v, [dram("A", 62)], NOW))
    assert (p.prefill_node, p.pulls, p.num_cached_tokens) == ("B", (), 0)
    assert p.predicted_ttft_s == pytest.approx(0.01 + 2.0)


def test_a_local_hit_beats_a_pull() -> None:
    v = view(node("p1", "prefill"), node("p2", "prefill"), node("d", "decode"))
    p = placed(place(LONG, v, [dram("p2", 62)], NOW))
    assert (p.prefill_node, p.pulls, p.num_cached_tokens) == ("p2", (), 1984)
    assert p.predicted_ttft_s == pytest.approx(0.01 + 0.016)


def test_only_the_blocks_missing_locally_are_pulled() -> None:
    v = view(
        node("p1", "prefill"),
        node("p3", "prefill", queued_tokens=50_000),
        node("d", "decode"),
    )
    p = placed(place(LONG, v, [dram("p3", 60), dram("p1", 40)], NOW))
    assert (p.prefill_node, p.pulls, p.num_cached_tokens) == ("p1", (Pull("p3", 40, 20),), 1920)


def test_the_source_is_the_holder_that_makes_the_pull_cheapest() -> None:
    busy = {"queued_tokens": 50_000}
    fast_links = view(
        node("p1", "prefill"),
        node("p2", "prefill", **busy),
        node("p3", "prefill", **busy),
        node("d", "decode"),
    )
    holders = [dram("p3", 60), dram("p2", 30)]
    assert placed(place(LONG, fast_links, holders, NOW)).pulls == (Pull("p3", 0, 60),)
    slow_to_p3 = view(
        node("p1", "prefill", fetch_bandwidth={"p2": 1e9, "p3": 1e6}),
        node("p2", "prefill", **busy),
        node("p3", "prefill", **busy),
        node("d", "decode"),
    )
    assert placed(place(LONG, slow_to_p3, holders, NOW)).pulls == (Pull("p2", 0, 30),)


def test_only_dram_blocks_of_live_nodes_count() -> None:
    # Lower tiers are a tierd's (test_scheduler_tiers.py), never a prefill or decode node's.
    v = view(
        node("p1", "prefill"),
        node("gone", "prefill", last_seen=NOW - 10),
        node("d1", "decode"),
        node("d-gone", "decode", last_seen=NOW - 10),
    )
    holders = [
        PrefixHolder("p1", "nvme", 62),
        PrefixHolder("p1", "s3", 62),
        PrefixHolder("d1", "nvme", 62),
        dram("gone", 62),
        dram("d-gone", 62),
        dram("unknown", 62),
    ]
    p = placed(place(LONG, v, holders, NOW))
    assert (p.prefill_node, p.pulls, p.num_cached_tokens) == ("p1", (), 0)


def test_a_history_held_by_a_decode_node_is_pulled_from_it() -> None:
    # The prompt blocks are on p1; the blocks of the reply generated last turn only on d1.
    v = view(node("p1", "prefill"), node("p2", "prefill", queued_tokens=4000), node("d1", "decode"))
    p = placed(place(LONG, v, [dram("d1", 62), dram("p1", 40), dram("p2", 50)], NOW))
    assert (p.prefill_node, p.pulls) == ("p1", (Pull("d1", 40, 22),))
    assert p.num_cached_tokens == 62 * 32


def test_the_last_prompt_token_is_always_computed() -> None:
    v = view(node("p", "prefill"), node("d", "decode"))
    p = placed(place(SMALL, v, [dram("p", 2)], NOW))  # 64 tokens: only block 0 may be reused
    assert p.num_cached_tokens == 32
    assert p.predicted_ttft_s == pytest.approx(0.01 + 0.032)


def test_cached_tokens_are_context_of_the_computed_ones() -> None:
    coef = StepCoefficients(0.01, 1e-3, 1e-6)
    v = view(node("p", "prefill"), node("d", "decode"), coef=coef)
    [cost] = prefill_costs(LONG, v, [dram("p", 62)], NOW)
    assert cost.compute_s == pytest.approx(prefill_seconds(coef, 16, 1984, 2048))
    assert cost.ttft_s == pytest.approx(cost.wait_s + cost.fetch_s + cost.compute_s)


def test_without_holders_placement_is_least_loaded() -> None:
    rng = random.Random(7)
    for _ in range(50):
        queues = {f"p{i}": rng.choice([0, 10, 100, 2048, 5000]) for i in range(5)}
        v = view(
            *(node(k, "prefill", queued_tokens=q) for k, q in queues.items()), node("d", "decode")
        )
        want = min(queues, key=lambda k: (queues[k], k))
        assert placed(place(SMALL, v, [], NOW)).prefill_node == want


def test_a_node_measured_faster_wins_over_an_idle_slow_one() -> None:
    v = view(node("slow", "prefill"), node("fast", "prefill", queued_tokens=200))
    v.update(node("d", "decode"))
    fast = StepCoefficients(0.001, 1e-4, 0.0)
    v.timing.add(
        "fast",
        "prefill",
        [StepSample(1, n, 0, fast.step_seconds(1, n, 0)) for n in range(1, 2000, 50)],
    )
    slow = StepCoefficients(0.01, 1e-3, 0.0)
    v.timing.add(
        "slow",
        "prefill",
        [StepSample(1, n, 0, slow.step_seconds(1, n, 0)) for n in range(1, 2000, 50)],
    )
    assert placed(place(LONG, v, [], NOW)).prefill_node == "fast"


def test_an_slo_the_prediction_exceeds_is_a_429_with_retry_after() -> None:
    v = view(node("p", "prefill", queued_tokens=8192), node("d", "decode"))
    ask = PlacementRequest(num_prompt_tokens=1000, max_tokens=8)
    wait = 4 * (0.01 + 2.048)
    ttft = wait + 0.01 + 1.0
    decision = place(ask, v, [], NOW, slo_s=2.0)
    assert isinstance(decision, Rejection)
    assert (decision.status, decision.cause) == (429, "ttft_slo")
    # The TTFT falls as the queue drains: it meets 2 s once its excess has drained.
    assert decision.retry_after_s == pytest.approx(ttft - 2.0)
    assert placed(place(ask, v, [], NOW, slo_s=ttft + 0.1)).predicted_ttft_s == pytest.approx(ttft)
    assert isinstance(place(ask, v, [], NOW), Placement)


def test_an_slo_no_queue_explains_retries_after_a_second() -> None:
    v = view(node("p", "prefill", queued_tokens=10), node("d", "decode"))
    # 1.01 s of prefill alone cannot meet 1 ms; no drain of the queue explains it, so retry
    # after a second.
    decision = place(PlacementRequest(1000, 8), v, [], NOW, slo_s=0.001)
    assert isinstance(decision, Rejection) and decision.status == 429
    assert decision.retry_after_s == 1.0


def test_a_request_an_idle_node_would_start_is_let_in_past_the_objective() -> None:
    v = view(node("p", "prefill"), node("d", "decode"))
    decision = place(PlacementRequest(1000, 8), v, [], NOW, slo_s=0.001)
    assert isinstance(decision, Placement) and decision.predicted_ttft_s > 0.001


def test_an_objective_already_spent_is_refused_even_on_an_idle_node() -> None:
    v = view(node("p", "prefill"), node("d", "decode"))
    decision = place(PlacementRequest(1000, 8), v, [], NOW, slo_s=0.0)
    assert isinstance(decision, Rejection) and decision.cause == "ttft_slo"


def test_decode_prefers_a_node_with_room() -> None:
    # SMALL needs 4 blocks. By the end of its 74 ms prefill d2 has made 3 steps of 20 ms, and
    # its 9 sequences' 27 new tokens took a fifth block: 4 of its 5 free blocks remain.
    v = view(
        node("p", "prefill"),
        node("d1", "decode", free_blocks=3),
        node("d2", "decode", running_seqs=9, free_blocks=5),
    )
    assert placed(place(SMALL, v, [], NOW)).decode_node == "d2"
    v.update(node("d2", "decode", running_seqs=9, free_blocks=4))
    assert placed(place(SMALL, v, [], NOW)).decode_node == "d1"  # neither has room: fewer seqs
    full = view(
        node("p", "prefill"),
        node("d1", "decode", free_blocks=0, running_seqs=2),
        node("d2", "decode", free_blocks=1, running_seqs=5),
    )
    assert placed(place(SMALL, full, [], NOW)).decode_node == "d1"


def test_decode_goes_to_the_best_predicted_time_between_tokens() -> None:
    v = view(
        node("p", "prefill"),
        node("d_fast", "decode", running_seqs=6),
        node("d_slow", "decode", running_seqs=0),
    )
    for name, coef in (
        ("d_fast", StepCoefficients(0.01, 1e-3, 0)),
        ("d_slow", StepCoefficients(0.1, 1e-2, 0)),
    ):
        samples = [
            StepSample(b, b, 100 * b, coef.step_seconds(b, b, 100 * b)) for b in range(1, 21)
        ]
        v.timing.add(name, "decode", samples)
    p = placed(place(SMALL, v, [], NOW))
    assert p.decode_node == "d_fast"
    assert p.predicted_tbt_s == pytest.approx(0.01 + 7e-3, rel=1e-3)


def test_decode_context_counts_with_an_attention_cost() -> None:
    coef = StepCoefficients(0.01, 1e-3, 1e-5)
    v = view(
        node("p", "prefill"),
        node("d1", "decode", free_blocks=10, running_seqs=2),
        node("d2", "decode", free_blocks=90, running_seqs=2),
        coef=coef,
    )
    assert placed(place(SMALL, v, [], NOW)).decode_node == "d2"


def test_placements_count_until_the_next_heartbeat() -> None:
    v = view(
        node("p1", "prefill"), node("p2", "prefill"), node("d1", "decode"), node("d2", "decode")
    )
    first = placed(place(SMALL, v, [], NOW))
    record_placement(v, first, SMALL)
    second = placed(place(SMALL, v, [], NOW))
    assert {first.prefill_node, second.prefill_node} == {"p1", "p2"}
    assert {first.decode_node, second.decode_node} == {"d1", "d2"}
    v.update(node(first.prefill_node, "prefill", queued_tokens=0))
    assert v.nodes[first.prefill_node].placed_tokens == 0


def test_a_placement_counts_only_the_tokens_to_compute() -> None:
    v = view(node("p", "prefill"), node("d", "decode"))
    p = placed(place(LONG, v, [dram("p", 62)], NOW))
    record_placement(v, p, LONG)
    assert v.nodes["p"].placed_tokens == 16
    arrivals = v.arrivals("d")
    assert (arrivals.seqs, arrivals.blocks, arrivals.tokens) == (1, 63, 2000)
    assert arrivals.entries[0].arrives_at == pytest.approx(NOW + 0.01 + 0.016)


def test_long_dead_nodes_are_forgotten() -> None:
    v = view(node("p1", "prefill", last_seen=NOW - 31), node("p2", "prefill"))
    v.timing.add("p1", "prefill", [StepSample(1, 10, 0, 0.1)])
    assert v.forget_dead(NOW) == ["p1"] and list(v.nodes) == ["p2"]
    assert v.timing.num_samples("p1") == 0


def test_fetch_bandwidth_falls_back_to_what_is_known() -> None:
    a = node("a", "prefill", fetch_bandwidth={"b": 2e9, "c": 4e9})
    fresh = node("fresh", "prefill")
    v = view(a, fresh, default_fetch_bandwidth=5e8)
    assert v.fetch_bandwidth(a, "b") == 2e9
    assert v.fetch_bandwidth(a, "z") == 3e9  # the mean of a's own links
    assert v.fetch_bandwidth(fresh, "a") == 3e9  # the mean over the cluster
    assert view(fresh, default_fetch_bandwidth=5e8).fetch_bandwidth(fresh, "a") == 5e8


def test_the_round_robin_baseline_takes_prefill_nodes_in_turn() -> None:
    v = view(
        node("p2", "prefill"),
        node("p1", "prefill", queued_tokens=50_000),
        node("gone", "prefill", last_seen=0),
        node("d", "decode"),
    )
    chosen = [placed(place_round_robin(LONG, v, turn, NOW)) for turn in range(4)]
    assert [p.prefill_node for p in chosen] == ["p1", "p2", "p1", "p2"]
    assert all(p.pulls == () and p.num_cached_tokens == 0 for p in chosen)
    assert chosen[1].predicted_ttft_s == pytest.approx(0.01 + 2.0)
    rejected = place_round_robin(LONG, v, 0, NOW, slo_s=5.0)  # p1's queue takes ~25 s
    assert isinstance(rejected, Rejection) and rejected.status == 429
    assert place_round_robin(LONG, view(node("d", "decode")), 0, NOW) == Rejection(
        "no prefill node is available", 503, cause="no_prefill_node"
    )
