"""A decode node's load predicted for when a request's prefill ends, and the ledger of placed
requests it counts.

The step-time model is 10 ms per step plus 1 ms per sequence and no attention cost, so a step
of ``b`` sequences takes ``10 + b`` ms; blocks hold 32 tokens.
"""

from __future__ import annotations

import msgspec
import pytest

from services.scheduler.cluster import ClusterView, NodeLoad
from services.scheduler.costs import PlacementRequest
from services.scheduler.forecast import RETRY_CAP_S, blocks_needed, forecast, retry_after
from services.scheduler.inflight import Arrivals, InFlight
from services.scheduler.timing import StepCoefficients, StepTimes, decode_step_seconds
from shared.cluster_messages import NodeStatus

NOW = 100.0
COEF = StepCoefficients(base_s=0.01, per_token_s=1e-3, per_attention_s=0.0)
ASK = PlacementRequest(num_prompt_tokens=64, max_tokens=64)  # 4 blocks


def decode(node_id: str = "d", **load: object) -> NodeLoad:
    values: dict[str, object] = {
        "queued_tokens": 0,
        "running_seqs": 4,
        "free_blocks": 80,
        "total_blocks": 100,
        "block_size": 32,
        "last_seen": NOW,
    } | load
    return NodeLoad(node_id=node_id, role="decode", **values)  # type: ignore[arg-type]


def view(*nodes: NodeLoad, coef: StepCoefficients = COEF) -> ClusterView:
    v = ClusterView(3.0, timing=StepTimes(coef))
    for n in nodes:
        v.update(n)
    return v


def flight(
    request_id: str, arrives_at: float, blocks: int = 10, tokens: int = 200, prefill: str = "p"
) -> InFlight:
    return InFlight(request_id, prefill, 100, "d", NOW, arrives_at, blocks, tokens)


FINISHING = ((40, 500), (2, 64), (5, 100))  # sorted by the view: 2, 5, then 40 tokens left


def test_sequences_that_will_have_finished_leave_the_forecast() -> None:
    v = view(decode(finishing=FINISHING))
    f = forecast(v.nodes["d"], v, ASK, NOW + 0.1)
    # 5 sequences step in 15 ms: 6 steps in 100 ms, so those with 2 and 5 tokens left go.
    # The other 2 make 12 tokens (a block); the 64- and 100-token ones free 2 + 4 blocks.
    assert (f.seqs, f.context_tokens, f.free_blocks, f.needed_blocks) == (3, 552, 85, 4)
    assert f.tbt_s == pytest.approx(0.013) and f.fits
    assert v.nodes["d"].finishing == ((2, 64), (5, 100), (40, 500))


def test_requests_still_prefilling_count_when_they_are_due() -> None:
    v = view(decode(finishing=FINISHING))
    v.record(flight("early", NOW + 0.05))
    v.record(flight("late", NOW + 0.5, blocks=7, tokens=300))
    f = forecast(v.nodes["d"], v, ASK, NOW + 0.1)
    # "early" joins the batch (6 sequences: 16 ms, still 6 steps); "late" is not there yet,
    # but the KV of both is spoken for.
    assert (f.seqs, f.context_tokens, f.free_blocks) == (4, 752, 68)
    assert f.tbt_s == pytest.approx(0.014)
    later = forecast(v.nodes["d"], v, ASK, NOW + 0.6)  # 7 seqs: 17 ms, 35 steps
    assert (later.seqs, later.context_tokens) == (5, 640 + 500 + 64 - 164 + 2 * 35)


def test_steps_count_from_the_heartbeat_and_attention_from_the_context() -> None:
    coef = StepCoefficients(0.01, 1e-3, 1e-5)
    v = view(decode(last_seen=NOW - 1.0, finishing=FINISHING), coef=coef)
    f = forecast(v.nodes["d"], v, ASK, NOW)
    # A step of 5 over 704 tokens takes 22.065 ms: 45 steps since the heartbeat, so the
    # sequence with 40 tokens left is gone too.
    assert decode_step_seconds(coef, 5, 704) == pytest.approx(0.022065)
    assert (f.seqs, f.context_tokens) == (2, 704 - 664 + 45)
    assert f.tbt_s == pytest.approx(decode_step_seconds(coef, 2, 85))


def test_a_forecast_without_room_does_not_fit() -> None:
    v = view(decode(free_blocks=5, running_seqs=0))
    v.record(flight("a", NOW + 1, blocks=2))
    f = forecast(v.nodes["d"], v, ASK, NOW)
    assert (f.free_blocks, f.needed_blocks, f.fits) == (3, 4, False)
    assert blocks_needed(v.nodes["d"], PlacementRequest(65, 31)) == 3


def test_a_heartbeat_forgets_the_requests_due_before_it() -> None:
    v = view(decode(), NodeLoad("p", "prefill", 0, 0, 10, 10, 32, NOW))
    v.record(flight("a", NOW + 0.5))
    v.record(flight("b", NOW + 2.0, blocks=3))
    assert v.nodes["p"].placed_tokens == 200
    v.update(decode(last_seen=NOW + 1.0))
    arrivals = v.arrivals("d")
    assert [e.request_id for e in arrivals.entries] == ["b"]
    assert (arrivals.seqs, arrivals.blocks, arrivals.tokens) == (1, 3, 200)
    assert not v.withdraw("a")  # arrived: the node counts it now


def test_a_heartbeat_forgets_the_requests_it_names_as_arrived_however_late_they_were_due() -> None:
    # A busy host's predictions run long: a request due 9 s on may be done in one.
    v = view(decode(), decode("d2"))
    v.record(flight("a", NOW + 9.0))
    v.record(flight("b", NOW + 9.0, blocks=3, tokens=50))
    v.record(flight("c", NOW + 9.0, blocks=4, tokens=70))
    # "b" went to d2 instead (a prefill node hands over to any ranked decode node), and
    # "unknown" was never placed here or was withdrawn: neither matters to d.
    v.update(decode(last_seen=NOW + 1.0), ("a", "unknown"))
    v.update(decode("d2", last_seen=NOW + 1.0), ("b",))
    arrivals = v.arrivals("d")
    assert [e.request_id for e in arrivals.entries] == ["c"]
    assert (arrivals.seqs, arrivals.blocks, arrivals.tokens) == (1, 4, 70)
    assert v.arriving_by("d", NOW + 10.0) == (1, 70)
    assert not v.withdraw("a") and not v.withdraw("b") and v.withdraw("c")


def test_withdrawing_uncounts_a_request_everywhere() -> None:
    v = view(decode(), NodeLoad("p", "prefill", 0, 0, 10, 10, 32, NOW - 0.5))
    v.record(flight("a", NOW + 1))
    v.record(flight("b", NOW + 1))
    assert v.withdraw("a") and not v.withdraw("a")
    assert v.nodes["p"].placed_tokens == 100
    assert [e.request_id for e in v.arrivals("d").entries] == ["b"]
    # Placed before the prefill node's last heartbeat: that reset its count already.
    v.update(NodeLoad("p", "prefill", 100, 0, 10, 10, 32, NOW + 0.5))
    assert v.withdraw("b") and v.nodes["p"].placed_tokens == 0


def test_a_request_placed_again_replaces_its_earlier_placement() -> None:
    v = view(decode())
    v.record(flight("a", NOW + 1, blocks=5))
    v.record(flight("a", NOW + 2, blocks=9))
    arrivals = v.arrivals("d")
    assert (arrivals.seqs, arrivals.blocks) == (1, 9)
    v.record(flight("", NOW + 1))  # no id: counted, never withdrawn
    v.record(flight("", NOW + 1))
    assert arrivals.seqs == 3 and not v.withdraw("")


def test_a_restarted_node_starts_from_zero() -> None:
    v = view(decode(epoch="e1"), NodeLoad("p", "prefill", 0, 0, 10, 10, 32, NOW, epoch="p1"))
    v.record(flight("a", NOW + 5))
    v.update(decode(epoch="e1", last_seen=NOW + 1))
    assert v.arrivals("d").seqs == 1  # same process: still on its way
    v.update(decode(epoch="e2", last_seen=NOW + 2))
    assert v.arrivals("d").seqs == 0 and not v.withdraw("a")
    # A restarted prefill node lost what it was computing: none of it will arrive.
    v.record(flight("b", NOW + 5))
    v.update(NodeLoad("p", "prefill", 0, 0, 10, 10, 32, NOW + 3, epoch="p2"))
    assert v.arrivals("d").seqs == 0 and not v.withdraw("b")


def test_dead_nodes_take_their_arrivals_with_them() -> None:
    v = view(decode(last_seen=NOW - 31))
    v.record(flight("a", NOW + 1))
    assert v.forget_dead(NOW) == ["d"]
    assert v.arrivals("d").seqs == 0 and not v.withdraw("a")


def test_arrivals_stay_sorted_and_walk_only_the_late_ones() -> None:
    a = Arrivals()
    for name, t in (("x", 3.0), ("y", 1.0), ("z", 2.0)):
        a.add(flight(name, t, tokens=int(t * 100)))
    assert [e.request_id for e in a.entries] == ["y", "z", "x"]
    assert a.by(2.0) == (2, 300) and a.by(0.5) == (0, 0) and a.by(9.0) == (3, 600)
    assert [e.request_id for e in a.drop_until(2.0)] == ["y", "z"]
    assert (a.seqs, a.blocks, a.tokens) == (1, 10, 300)


def test_retry_after_is_the_first_delay_with_a_forecast_that_fits() -> None:
    # 40 sequences step in 50 ms; one of them has 30 tokens left: gone after 1.5 s, about.
    v = view(decode(running_seqs=40, finishing=((30, 64),)))
    node = v.nodes["d"]
    fast_enough = lambda f: f.tbt_s <= 0.050  # noqa: E731
    assert not fast_enough(forecast(node, v, ASK, NOW))
    assert retry_after([node], v, ASK, NOW, fast_enough) == 2.0
    assert retry_after([node], v, ASK, NOW, lambda f: False) == RETRY_CAP_S


def test_the_heartbeat_carries_the_finishing_sequences_within_limits() -> None:
    beat = NodeStatus(node_id="d", role="decode", finishing_seqs=[(2, 64), (5, 100)])
    wire = msgspec.json.encode(beat)
    assert b'"finishing_seqs":[[2,64],[5,100]]' in wire
    assert msgspec.json.decode(wire, type=NodeStatus).finishing_seqs == [(2, 64), (5, 100)]
    for bad in ([[-1, 64]], [[2, 64, 1]], [[2, 64]] * 257):
        forged = wire.replace(b"[[2,64],[5,100]]", msgspec.json.encode(bad))
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(forged, type=NodeStatus)
