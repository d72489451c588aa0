"""The node's ledger: holdings, replays and leases, exactly."""

from __future__ import annotations

from shared.messages import TokenLogprob
from shared.node.ledger import DONE_TTL_S, Ledger, Stage


def test_a_holding_records_output_and_replays_from_any_position() -> None:
    ledger = Ledger(lease_ttl_s=5)
    ledger.open("r", "gw", 0.0, offset=3)
    ledger.record("r", [10, 11], [TokenLogprob(10, -0.1, []), TokenLogprob(11, -0.2, [])])
    ledger.record("r", [12], None)
    reply = ledger.replay("r", 4)
    assert (reply.known, reply.running, reply.index, reply.token_ids) == (True, True, 4, [11, 12])
    assert reply.logprobs is not None and [lp.token_id for lp in reply.logprobs] == [11]
    assert ledger.replay("r", 0).index == 3  # nothing before the offset is this node's
    assert ledger.get("r") is not None and ledger.get("r").next_index == 6  # type: ignore[union-attr]
    ledger.finish("r", 1.0, reason="length")
    done = ledger.replay("r", 6)
    assert not done.running and done.finish_reason == "length" and done.token_ids == []
    assert ledger.finish("r", 2.0, reason="stop") is None  # finishing twice does nothing
    assert ledger.replay("nope", 0).known is False


def test_only_real_finishes_are_replayed_as_finishes() -> None:
    ledger = Ledger(lease_ttl_s=5)
    ledger.open("r", "gw", 0.0, offset=0)
    holding = ledger.get("r")
    assert holding is not None
    holding.owner, holding.owner_epoch = "d1", "e1"
    ledger.finish("r", 1.0, reason="handed_over")
    reply = ledger.replay("r", 0)
    assert reply.finish_reason is None and (reply.owner, reply.owner_epoch) == ("d1", "e1")


def test_finished_holdings_are_forgotten_after_their_window() -> None:
    ledger = Ledger(lease_ttl_s=5)
    for rid in ("a", "b"):
        ledger.open(rid, "gw", 0.0, 0)
    ledger.finish("a", 10.0, reason="stop")
    ledger.forget_done(10.0 + DONE_TTL_S - 1)
    assert ledger.get("a") is not None
    ledger.forget_done(10.0 + DONE_TTL_S + 1)
    assert ledger.get("a") is None and ledger.active("b") is not None


def test_requests_are_grouped_by_gateway_and_deadline() -> None:
    ledger = Ledger(lease_ttl_s=5)
    ledger.open("a", "gw1", 100.0, 0)
    ledger.open("b", "gw2", 0.0, 0)
    ledger.open("c", "gw1", 300.0, 0)
    ledger.open("d", "", 0.0, 0)
    ledger.finish("c", 1.0, reason="stop")
    assert ledger.by_gateway() == {"gw1": ["a"], "gw2": ["b"]}
    assert ledger.overdue(200.0) == ["a"]  # no deadline (0) never expires
    assert ledger.count(Stage.QUEUED) == 3 and ledger.active_ids() == ["a", "b", "d"]


def test_a_lease_serves_its_own_blocks_with_its_token_until_it_ends_once() -> None:
    ledger = Ledger(lease_ttl_s=5)
    lease = ledger.grant("r", [4, 5, 6], now=0.0)
    assert len(lease.token) >= 24 and lease.token != "r" and not lease.pinned
    assert ledger.blocks_for(lease.token, [5, 4], 1.0) == [5, 4]
    assert ledger.blocks_for(lease.token, [7], 1.0) is None
    assert ledger.blocks_for("r", [4], 1.0) is None  # the request id is no credential
    assert ledger.blocks_for(lease.token, [4], 6.0) is None  # expired
    pin = ledger.grant("", [9], now=0.0)
    assert pin.pinned and ledger.num_pins == 1 and ledger.num_leases == 2
    assert ledger.release_all("r") == [lease] and ledger.release(lease.token) is None
    assert ledger.expire(4.0) == [] and ledger.expire(6.0) == [pin] and ledger.expire(7.0) == []
