"""The scheduler's placement policy on hand-built cluster views."""

from __future__ import annotations

from services.scheduler.policy import (
    ClusterView,
    NodeLoad,
    Placement,
    PlacementRequest,
    Rejection,
    place,
    record_placement,
)

NOW = 100.0
SMALL = PlacementRequest(num_prompt_tokens=64, max_tokens=64)  # 4 blocks of 32


def node(node_id: str, role: str, **load: float) -> NodeLoad:
    values = {
        "queued_tokens": 0,
        "running_seqs": 0,
        "free_blocks": 100,
        "total_blocks": 100,
        "block_size": 32,
        "last_seen": NOW,
    } | load
    return NodeLoad(node_id=node_id, role=role, **values)  # type: ignore[arg-type]


def view(*nodes: NodeLoad) -> ClusterView:
    v = ClusterView(heartbeat_timeout_s=3.0)
    for n in nodes:
        v.update(n)
    return v


def test_picks_the_least_loaded_nodes() -> None:
    v = view(
        node("p1", "prefill", queued_tokens=500),
        node("p2", "prefill", queued_tokens=20),
        node("d1", "decode", running_seqs=3),
        node("d2", "decode", running_seqs=1),
    )
    assert place(SMALL, v, NOW) == Placement("p2", "d2")


def test_nodes_without_a_recent_heartbeat_or_draining_are_skipped() -> None:
    v = view(
        node("p1", "prefill", last_seen=NOW - 10),
        node("p2", "prefill", queued_tokens=900),
        node("d1", "decode", draining=True),
        node("d2", "decode", running_seqs=50),
    )
    assert place(SMALL, v, NOW) == Placement("p2", "d2")


def test_no_live_node_of_a_role_is_a_503() -> None:
    assert place(SMALL, view(node("d1", "decode")), NOW) == Rejection(
        "no prefill node is available", 503
    )
    decision = place(SMALL, view(node("p1", "prefill"), node("d", "decode", last_seen=0)), NOW)
    assert isinstance(decision, Rejection) and "decode" in decision.reason


def test_decode_prefers_a_node_with_room() -> None:
    v = view(
        node("p", "prefill"),
        node("d1", "decode", free_blocks=3),
        node("d2", "decode", running_seqs=9, free_blocks=4),
    )
    assert place(SMALL, v, NOW) == Placement("p", "d2")
    full = view(
        node("p", "prefill"),
        node("d1", "decode", free_blocks=0, running_seqs=2),
        node("d2", "decode", free_blocks=1, running_seqs=5),
    )
    assert place(SMALL, full, NOW) == Placement("p", "d1")


def test_placements_count_until_the_next_heartbeat() -> None:
    v = view(
        node("p1", "prefill"), node("p2", "prefill"), node("d1", "decode"), node("d2", "decode")
    )
    first = place(SMALL, v, NOW)
    assert isinstance(first, Placement)
    record_placement(v, first, SMALL)
    second = place(SMALL, v, NOW)
    assert isinstance(second, Placement)
    assert {first.prefill_node, second.prefill_node} == {"p1", "p2"}
    assert {first.decode_node, second.decode_node} == {"d1", "d2"}
    v.update(node(first.prefill_node, "prefill", queued_tokens=0))
    assert v.nodes[first.prefill_node].placed_tokens == 0


def test_long_dead_nodes_are_forgotten() -> None:
    v = view(node("p1", "prefill", last_seen=NOW - 31), node("p2", "prefill"))
    assert v.forget_dead(NOW) == ["p1"] and list(v.nodes) == ["p2"]
