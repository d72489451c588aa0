"""The hand-off's decisions, without a node: offers in rank order, withdrawals, giving up;
reserving, pulling and what follows a pull."""

from __future__ import annotations

from shared.engine.types import ImportSlot
from shared.node.handoff import (
    NO_DECODE_NODE,
    AfterPull,
    GiveUp,
    Offer,
    OfferAnswer,
    Owned,
    Reply,
    Reserved,
    Stop,
    Withdraw,
    after_pull,
    after_reserve,
    next_offer,
    pull_span,
)


def test_offers_go_to_the_ranked_nodes_in_turn_until_one_accepts() -> None:
    effects, left = next_offer(("d1", "d2", "d3"), None, active=True)
    assert effects == [Offer("d1")] and left == ("d2", "d3")
    effects, left = next_offer(left, OfferAnswer("d1", Reply.REFUSED, "busy"), active=True)
    assert effects == [Offer("d2")] and left == ("d3",)
    effects, left = next_offer(left, OfferAnswer("d2", Reply.ACCEPTED, epoch="e2"), active=True)
    assert effects == [Owned("d2", "e2")]


def test_a_node_that_did_not_answer_is_told_to_drop_it_and_never_asked_again() -> None:
    effects, left = next_offer(("d2",), OfferAnswer("d1", Reply.SILENT), active=True)
    assert effects == [Withdraw("d1"), Offer("d2")] and left == ()
    effects, _ = next_offer(left, OfferAnswer("d2", Reply.SILENT), active=True)
    assert effects == [Withdraw("d2"), GiveUp(NO_DECODE_NODE, 503)]


def test_a_gone_node_is_passed_over_and_no_node_left_gives_up() -> None:
    effects, _ = next_offer((), OfferAnswer("d1", Reply.GONE), active=True)
    assert effects == [GiveUp(NO_DECODE_NODE, 503)]
    assert next_offer((), None, active=True)[0] == [GiveUp(NO_DECODE_NODE, 503)]


def test_a_refusal_with_an_error_code_ends_the_round_at_once() -> None:
    answer = OfferAnswer("d1", Reply.FAILED, "the grammar rejects it", 400)
    effects, left = next_offer(("d2",), answer, active=True)
    assert effects == [GiveUp("the grammar rejects it", 400)] and left == ("d2",)


def test_an_aborted_request_is_offered_no_further() -> None:
    effects, _ = next_offer(("d2",), OfferAnswer("d1", Reply.SILENT), active=False)
    assert effects == [Withdraw("d1"), Stop()]
    assert next_offer(("d1",), None, active=False)[0] == [Stop()]


def test_reserving_and_what_follows_a_pull() -> None:
    assert after_reserve(None, refused=False) is Reserved.NO_ROOM
    assert after_reserve(None, refused=True) is Reserved.REFUSED
    assert after_reserve(ImportSlot(0, [7]), refused=False) is Reserved.RESERVED
    assert after_pull(active=False, pulled_all=True) is AfterPull.ABORT
    assert after_pull(active=True, pulled_all=True) is AfterPull.RUN
    assert after_pull(active=True, pulled_all=False) is AfterPull.RECOMPUTE


def test_the_pull_skips_the_blocks_already_cached_here() -> None:
    span = pull_span([10, 11, 12], [1, 2, 3], ImportSlot(1, [20, 21]))
    assert (span.source_ids, span.checksums, span.matches) == ([11, 12], [2, 3], True)
    assert not pull_span([10, 11], [1, 2], ImportSlot(0, [20, 21, 22])).matches
    assert not pull_span([10, 11], [1], ImportSlot(0, [20, 21])).matches
