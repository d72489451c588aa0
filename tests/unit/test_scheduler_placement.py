"""Placement on a cluster that loses nodes: nodes to avoid, unhealthy and draining nodes, ranked
decode candidates, resumed requests, and refusals on the predicted decode load.

The step-time model is 10 ms per step plus 1 ms per token and no attention cost: a decode step
of ``b`` sequences takes ``10 + b`` ms, a 64-token prefill 74 ms.
"""

from __future__ import annotations

import pytest

from services.scheduler.policy import (
    Placement,
    PlacementRequest,
    Pull,
    Rejection,
    place,
    place_round_robin,
    record_placement,
)
from shared.rpc.types import PrefixHolder
from tests.unit.scheduler_nodes import NOW, cluster, node, placed

SMALL = PlacementRequest(num_prompt_tokens=64, max_tokens=64, request_id="r1")
LONG = PlacementRequest(num_prompt_tokens=2000, max_tokens=16)


def rejected(decision: Placement | Rejection) -> Rejection:
    assert isinstance(decision, Rejection), decision
    return decision


def test_nodes_to_avoid_are_never_picked() -> None:
    v = cluster(
        node("p1", "prefill"),
        node("p2", "prefill", queued_tokens=100),
        node("d1", "decode"),
        node("d2", "decode", running_seqs=5),
    )
    p = placed(place(SMALL, v, [], NOW))
    assert (p.prefill_node, p.decode_nodes) == ("p1", ["d1", "d2"])
    p = placed(place(SMALL, v, [], NOW, avoid={"p1", "d1"}))
    assert (p.prefill_node, p.decode_nodes) == ("p2", ["d2"])
    assert rejected(place(SMALL, v, [], NOW, avoid={"p1", "p2"})).cause == "no_prefill_node"
    assert rejected(place(SMALL, v, [], NOW, avoid={"d1", "d2"})).cause == "no_decode_node"
    rr = placed(place_round_robin(SMALL, v, 0, NOW, avoid={"p1"}))
    assert rr.prefill_node == "p2"


def test_an_avoided_node_is_not_pulled_from() -> None:
    v = cluster(
        node("A", "prefill", queued_tokens=20_000), node("B", "prefill"), node("d", "decode")
    )
    holders = [PrefixHolder("A", "dram", 62)]
    assert placed(place(LONG, v, holders, NOW)).pulls == (Pull("A", 0, 62),)
    v.update(node("C", "prefill", queued_tokens=30_000))
    p = placed(place(LONG, v, holders, NOW, avoid={"A"}))
    assert (p.prefill_node, p.pulls) == ("B", ())


def test_unhealthy_or_draining_nodes_get_no_work_but_serve_pulls() -> None:
    v = cluster(
        node("sick", "prefill", healthy=False),
        node("leaving", "prefill", draining=True),
        node("p", "prefill", queued_tokens=5000),
        node("d-sick", "decode", healthy=False),
        node("d-leaving", "decode", draining=True),
        node("d", "decode", running_seqs=30),
    )
    p = placed(place(LONG, v, [PrefixHolder("leaving", "dram", 62)], NOW))
    assert (p.prefill_node, p.decode_nodes, p.pulls) == ("p", ["d"], (Pull("leaving", 0, 62),))
    p = placed(place(LONG, v, [PrefixHolder("d-sick", "dram", 40)], NOW))
    assert p.pulls == (Pull("d-sick", 0, 40),)
    assert [n.node_id for n in v.live("decode", NOW)] == ["d-sick", "d-leaving", "d"]
    assert [n.node_id for n in v.targets("decode", NOW)] == ["d"]
    assert {n.node_id for n in v.sources(NOW)} == {
        "sick",
        "leaving",
        "p",
        "d-sick",
        "d-leaving",
        "d",
    }


def test_a_silent_node_serves_no_pulls() -> None:
    v = cluster(
        node("gone", "prefill", last_seen=NOW - 3.5, draining=True),
        node("p", "prefill"),
        node("d", "decode"),
    )
    assert placed(place(LONG, v, [PrefixHolder("gone", "dram", 62)], NOW)).pulls == ()
    assert [n.node_id for n in v.sources(NOW)] == ["p", "d"]


def test_decode_candidates_are_ranked_best_first_up_to_three() -> None:
    v = cluster(
        node("p", "prefill"),
        node("d-full", "decode", free_blocks=2),
        node("d5", "decode", running_seqs=5),
        node("d0", "decode"),
        node("d9", "decode", running_seqs=9),
        node("d2", "decode", running_seqs=2),
    )
    p = placed(place(SMALL, v, [], NOW))
    assert p.decode_nodes == ["d0", "d2", "d5"] and p.decode_node == "d0"
    assert p.predicted_tbt_s == pytest.approx(0.011)
    assert p.placed_at == NOW
    few = cluster(
        node("p", "prefill"), node("d-full", "decode", free_blocks=2), node("d", "decode")
    )
    assert placed(place(SMALL, few, [], NOW)).decode_nodes == ["d", "d-full"]


def test_a_placement_counts_on_its_first_decode_node_until_due() -> None:
    v = cluster(node("p", "prefill"), node("d1", "decode"), node("d2", "decode"))
    first = placed(place(SMALL, v, [], NOW))
    record_placement(v, first, SMALL)
    assert first.decode_nodes == ["d1", "d2"]
    assert placed(place(SMALL, v, [], NOW)).decode_nodes == ["d2", "d1"]
    # A heartbeat from d1 before the prefill ends does not show it yet: it still counts.
    v.update(node("d1", "decode", last_seen=NOW + 0.05))
    assert placed(place(SMALL, v, [], NOW + 0.05)).decode_node == "d2"
    assert v.withdraw("r1")
    assert placed(place(SMALL, v, [], NOW + 0.05)).decode_node == "d1"


def test_every_decode_node_too_slow_is_a_429() -> None:
    # 40 running: one more makes a 51 ms step; the objective is 50 ms.
    v = cluster(node("p", "prefill"), node("d", "decode", running_seqs=40, finishing=((30, 64),)))
    decision = rejected(place(SMALL, v, [], NOW, tbt_slo_s=0.050))
    assert (decision.status, decision.cause) == (429, "tbt_slo")
    # The sequence with 30 tokens left is gone 30 steps (1.53 s) after the heartbeat.
    assert decision.retry_after_s == 2.0
    assert placed(place(SMALL, v, [], NOW, tbt_slo_s=0.052)).predicted_tbt_s == pytest.approx(0.051)
    assert placed(place(SMALL, v, [], NOW)).decode_node == "d"  # no objective: placed


def test_only_decode_nodes_meeting_the_objective_are_candidates() -> None:
    v = cluster(
        node("p", "prefill"),
        node("busy", "decode", running_seqs=45),
        node("ok", "decode", running_seqs=20),
    )
    assert placed(place(SMALL, v, [], NOW, tbt_slo_s=0.050)).decode_nodes == ["ok"]


def test_no_room_for_the_kv_anywhere_is_a_429() -> None:
    v = cluster(node("p", "prefill"), node("d", "decode", free_blocks=3))
    decision = rejected(place(SMALL, v, [], NOW, tbt_slo_s=1.0))
    assert (decision.status, decision.cause, decision.retry_after_s) == (429, "kv_full", 60.0)
    # Without a decode objective the request queues on the node instead.
    assert placed(place(SMALL, v, [], NOW)).decode_nodes == ["d"]


def test_a_resumed_request_is_never_refused_by_an_objective() -> None:
    v = cluster(
        node("p", "prefill", queued_tokens=8192),
        node("d", "decode", running_seqs=60, free_blocks=1),
    )
    assert rejected(place(SMALL, v, [], NOW, 1.0)).cause == "ttft_slo"
    assert rejected(place(SMALL, v, [], NOW, tbt_slo_s=0.05)).cause == "kv_full"
    p = placed(place(SMALL, v, [], NOW, 1.0, tbt_slo_s=0.05, resumed=True))
    assert (p.prefill_node, p.decode_nodes) == ("p", ["d"])
    rr = place_round_robin(SMALL, v, 0, NOW, 1.0, tbt_slo_s=0.05, resumed=True)
    assert placed(rr).decode_node == "d"
    # ... but it still needs nodes.
    assert rejected(place(SMALL, v, [], NOW, resumed=True, avoid={"d"})).status == 503


def test_a_restarted_decode_node_starts_from_zero() -> None:
    v = cluster(node("p", "prefill"), node("d1", "decode", epoch="a"), node("d2", "decode"))
    for i in range(3):
        ask = PlacementRequest(64, 64, request_id=f"r{i}")
        record_placement(v, placed(place(ask, v, [], NOW, avoid={"d2"})), ask)
    v.update(node("d2", "decode", running_seqs=2))
    assert placed(place(SMALL, v, [], NOW)).decode_node == "d2"
    v.update(node("d1", "decode", epoch="b"))
    assert placed(place(SMALL, v, [], NOW)).decode_node == "d1"
