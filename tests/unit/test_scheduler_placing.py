"""The offers of one request (``placing.Offers``), driven by hand: which node is offered the
task next, what each answer means, and when the request is answered."""

from __future__ import annotations

import pytest

from services.scheduler.placer import PlacementOptions, PlacementQuery, Placer
from services.scheduler.placing import (
    MAX_TRIES,
    NO_NODE_ACCEPTED,
    Accepted,
    Offer,
    Offers,
    Refused,
    Silence,
    Withdraw,
)
from services.scheduler.policy import PlacementRequest, Rejection
from shared.cluster_messages import TaskAck
from tests.unit.scheduler_nodes import NOW, cluster, node

ASK = PlacementRequest(num_prompt_tokens=64, max_tokens=8, request_id="r1")
LATER = NOW + 0.01  # after the nodes' last heartbeat: what is placed counts on them


def offers(prefills: int, options: PlacementOptions | None = None) -> Offers:
    """Offers of ``ASK`` on prefill nodes p1, p2, ... (each busier than the one before) and a
    decode node."""
    loads = [node(f"p{i + 1}", "prefill", queued_tokens=100 * i) for i in range(prefills)]
    view = cluster(*loads, node("d", "decode"))
    return Offers(Placer(view, options or PlacementOptions()), PlacementQuery(ASK), [])


def offered(effect: Offer | Refused) -> str:
    assert isinstance(effect, Offer), effect
    return effect.placement.prefill_node


def ack(node_id: str, **fields: object) -> TaskAck:
    return TaskAck(node_id=node_id, epoch="e-" + node_id, **fields)  # type: ignore[arg-type]


def counted(o: Offers, node_id: str) -> int:
    return o.placer.view.nodes[node_id].placed_tokens


def test_an_acknowledgement_ends_the_offers_accepted() -> None:
    o = offers(3)
    first = o.next(LATER)
    assert offered(first) == "p1" and counted(o, "p1") == 64  # counted before any answer
    assert isinstance(first, Offer)
    assert first.expected_ttft_s == pytest.approx(first.placement.predicted_ttft_s)
    answer = o.answer(ack("p1", accepted=True))
    assert answer == Accepted(first.placement, "e-p1", first.expected_ttft_s)
    assert counted(o, "p1") == 64  # it stays counted where it runs


def accepted_on(effect: Accepted | Withdraw | Refused) -> str:
    assert isinstance(effect, Accepted), effect
    return effect.placement.prefill_node


def test_a_refusal_moves_on_and_never_offers_that_node_again() -> None:
    o = offers(3)
    assert offered(o.next(LATER)) == "p1"
    assert o.answer(ack("p1", accepted=False, reason="draining")) == Withdraw("p1", abort=False)
    assert counted(o, "p1") == 0  # uncounted, though still the cheapest
    assert offered(o.next(LATER)) == "p2"
    assert o.answer(ack("p2", accepted=False)) == Withdraw("p2", abort=False)
    assert offered(o.next(LATER)) == "p3"
    assert accepted_on(o.answer(ack("p3", accepted=True))) == "p3"
    assert o.avoid == {"p1", "p2"} and counted(o, "p3") == 64


def test_a_timeout_withdraws_from_that_node_alone_and_moves_on() -> None:
    o = offers(3)
    assert offered(o.next(LATER)) == "p1"
    # It may have taken the task and lost only its answer: it alone is told to stop.
    assert o.answer(Silence(gone=False)) == Withdraw("p1", abort=True)
    assert counted(o, "p1") == 0
    assert offered(o.next(LATER)) == "p2"
    # Nothing serves p2's subject: it cannot hold the task, so there is nothing to abort.
    assert o.answer(Silence(gone=True)) == Withdraw("p2", abort=False)
    assert offered(o.next(LATER)) == "p3"


def test_after_max_tries_the_request_is_refused_with_503() -> None:
    o = offers(MAX_TRIES + 1)
    tried = []
    for _ in range(MAX_TRIES):
        tried.append(offered(o.next(LATER)))
        assert isinstance(o.answer(ack(tried[-1], accepted=False)), Withdraw)
    assert tried == ["p1", "p2", "p3"]
    last = o.next(LATER)
    assert last == Refused(Rejection(NO_NODE_ACCEPTED, 503), by_policy=False)
    assert all(counted(o, f"p{i}") == 0 for i in range(1, MAX_TRIES + 2))


def test_with_no_node_left_the_policy_refuses_the_request() -> None:
    o = offers(2)
    for name in ("p1", "p2"):
        assert offered(o.next(LATER)) == name
        o.answer(Silence(gone=True))
    last = o.next(LATER)
    assert isinstance(last, Refused) and last.by_policy
    assert (last.rejection.status, last.rejection.cause) == (503, "no_prefill_node")


def test_an_error_code_in_a_refusal_ends_the_offers_at_once() -> None:
    o = offers(3)
    assert offered(o.next(LATER)) == "p1"
    refusal = ack("p1", accepted=False, reason="max_tokens over the limit", error_code=400)
    assert o.answer(refusal) == Refused(
        Rejection("max_tokens over the limit", 400), by_policy=False
    )
    assert counted(o, "p1") == 0 and o.avoid == set()


def test_an_objective_the_policy_cannot_meet_refuses_before_any_offer() -> None:
    # A node with a queue: one that would start the request at once lets it in regardless.
    view = cluster(node("p1", "prefill", queued_tokens=50), node("d", "decode"))
    tight = Offers(Placer(view, PlacementOptions()), PlacementQuery(ASK, slo_s=1e-4), [])
    first = tight.next(LATER)
    assert isinstance(first, Refused) and first.by_policy
    assert (first.rejection.status, first.rejection.cause) == (429, "ttft_slo")
    assert counted(tight, "p1") == 0 and tight.tries == 0


def test_the_round_robin_baseline_passes_over_a_refusing_node_too() -> None:
    o = offers(3, PlacementOptions(round_robin=True))
    first = offered(o.next(LATER))
    o.answer(ack(first, accepted=False))
    second = offered(o.next(LATER))
    assert second != first
    o.answer(Silence(gone=False))
    assert offered(o.next(LATER)) not in {first, second}


def test_answers_and_offers_alternate() -> None:
    o = offers(2)
    with pytest.raises(AssertionError):
        o.answer(ack("p1", accepted=True))  # nothing was offered
    o.next(LATER)
    with pytest.raises(AssertionError):
        o.next(LATER)  # the offer awaits its answer
