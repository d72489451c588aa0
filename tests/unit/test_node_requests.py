"""The node's request table: checked transitions, replays, and what it forgets."""

from __future__ import annotations

import pytest

from shared.cluster_messages import MAX_ARRIVED
from shared.messages import TokenLogprob
from shared.node.requests import DONE_TTL_S, NodeRequest, RequestTable, Stage, StageError


def accept(
    table: RequestTable, rid: str, gateway: str = "gw", deadline: float = 0.0, offset: int = 0
) -> NodeRequest:
    return table.accept(NodeRequest(rid, gateway, deadline, offset))


def test_a_prefill_request_walks_its_stages_and_is_replayed_from_any_position() -> None:
    table = RequestTable()
    accept(table, "r", offset=3)
    assert table.admitted("r") is not None and table.get("r").stage is Stage.ADMITTED  # type: ignore[union-attr]
    table.first_token("r", [10], [TokenLogprob(10, -0.1, [])], 32, {"dram": 32})
    assert table.offered("r") is not None
    request = table.leased("r", "d1", "e1")
    assert request is not None and (request.owner, request.owner_epoch) == ("d1", "e1")
    reply = table.replay("r", 0)
    assert (reply.index, reply.token_ids, reply.running) == (3, [10], True)
    assert reply.num_cached_tokens == 32 and reply.cached_by_tier == {"dram": 32}
    assert table.finished("r", 1.0, "handed_over") is not None
    done = table.replay("r", 4)
    assert not done.running and done.finish_reason is None  # a hand-over ends no completion
    assert (done.owner, done.owner_epoch) == ("d1", "e1")
    assert table.outcomes["handed_over"] == 1


def test_a_decode_request_records_what_it_produces_until_it_finishes() -> None:
    table = RequestTable()
    accept(table, "r")
    table.first_token("r", [1], [TokenLogprob(1, -0.1, [])], 0, {})  # came with the hand-off
    table.admitted("r")
    table.running("r")
    table.produced("r", [2, 3], [TokenLogprob(2, -0.2, []), TokenLogprob(3, -0.3, [])])
    assert table.get("r").next_index == 3  # type: ignore[union-attr]
    reply = table.replay("r", 2)
    assert reply.token_ids == [3] and reply.logprobs is not None and len(reply.logprobs) == 1
    table.finished("r", 1.0, "length")
    assert table.replay("r", 3).finish_reason == "length"
    assert table.finished("r", 2.0, "stop") is None  # ending twice does nothing
    assert table.outcomes == {"length": 1}


@pytest.mark.parametrize(
    "wrong",
    [
        lambda t: t.offered("r"),  # offered before its prompt ran
        lambda t: t.leased("r", "d", "e"),
        lambda t: t.produced("r", [1], None),  # decoding before running
    ],
)
def test_a_transition_from_the_wrong_stage_raises(wrong) -> None:  # type: ignore[no-untyped-def]
    table = RequestTable()
    accept(table, "r")
    with pytest.raises(StageError):
        wrong(table)


def test_a_transition_of_a_request_already_ended_does_nothing() -> None:
    table = RequestTable()
    accept(table, "r")
    table.failed("r", 1.0, "bad", 400)
    assert table.admitted("r") is None and table.running("r") is None
    assert table.get("r").stage is Stage.DONE and table.get("r").error_code == 400  # type: ignore[union-attr]
    assert table.outcomes == {"error": 1}
    with pytest.raises(StageError):
        accept(table, "x") and accept(table, "x")  # an active id is never accepted twice
    assert accept(table, "r").stage is Stage.QUEUED  # a done one is replaced


def test_before_first_token_tells_prompts_still_computing() -> None:
    table = RequestTable()
    accept(table, "p")
    assert table.get("p").before_first_token  # type: ignore[union-attr]
    table.admitted("p")
    table.first_token("p", [5], None, 0, {})
    assert not table.get("p").before_first_token  # type: ignore[union-attr]


def test_done_requests_are_forgotten_after_their_window() -> None:
    table = RequestTable()
    accept(table, "a")
    accept(table, "b")
    table.finished("a", 10.0, "stop")
    table.forget_done(10.0 + DONE_TTL_S - 1)
    assert table.get("a") is not None
    table.forget_done(10.0 + DONE_TTL_S + 1)
    assert table.get("a") is None and table.active("b") is not None


def test_requests_are_grouped_by_gateway_and_deadline() -> None:
    table = RequestTable()
    accept(table, "a", "gw1", 100.0)
    accept(table, "b", "gw2", 0.0)
    accept(table, "c", "gw1", 300.0)
    accept(table, "d", "", 0.0)
    table.finished("c", 1.0, "stop")
    assert table.by_gateway() == {"gw1": ["a"], "gw2": ["b"]}
    assert table.overdue(200.0) == ["a"]  # no deadline (0) never expires
    assert table.count(Stage.QUEUED) == 3 and table.active_ids() == ["a", "b", "d"]


def test_the_ids_accepted_since_the_last_take_are_taken_once_the_newest_kept() -> None:
    table = RequestTable()
    accept(table, "a")
    accept(table, "b")
    table.finished("a", 1.0, "stop")  # ended before the heartbeat: it still arrived
    assert table.take_accepted() == ["a", "b"]
    assert table.take_accepted() == []
    for i in range(MAX_ARRIVED + 5):
        accept(table, f"r{i}")
    taken = table.take_accepted()
    assert len(taken) == MAX_ARRIVED and taken[-1] == f"r{MAX_ARRIVED + 4}"
