"""Conditional disaggregation: prefill on the decode node or hand off, on both sides of the
break-even point the measured step and hand-off times imply."""

from __future__ import annotations

import pytest

from services.scheduler.disaggregation import (
    Disaggregated,
    LocalPrefill,
    break_even_tokens,
    pause_seconds,
    prefer_local,
)
from services.scheduler.handoff import HandoffCoefficients, HandoffTimes, handoff_prior
from services.scheduler.policy import (
    ClusterView,
    CostParams,
    Placement,
    PlacementRequest,
    PrefillCost,
    Rejection,
    place,
)
from services.scheduler.timing import StepCoefficients, StepTimes, prefill_seconds
from shared.cluster_messages import StepSample
from shared.rpc.types import PrefixHolder
from tests.unit.scheduler_nodes import NOW, node, placed

COEF = StepCoefficients(base_s=0.01, per_token_s=1e-3, per_attention_s=1e-7)
STEP = CostParams().max_num_batched_tokens
#: Hand-offs measured at 30 ms plus 2 ms a block.
MEASURED = [(blocks, 0.03 + 0.002 * blocks) for blocks in range(1, 65)]


def cluster(running: int = 0, samples: list[tuple[int, float]] = MEASURED) -> ClusterView:
    view = ClusterView(3.0, timing=StepTimes(COEF))
    view.update(node("p", "prefill"))
    view.update(node("d", "decode", running_seqs=running, free_blocks=1000, local_prefill=True))
    view.handoffs.add(samples)
    return view


def decide(
    view: ClusterView,
    tokens: int,
    holders: list[PrefixHolder] | None = None,
    tbt_slo_s: float | None = None,
) -> Placement:
    ask = PlacementRequest(tokens, 8, request_id=f"r{tokens}")
    decision = place(ask, view, holders or [], NOW, tbt_slo_s=tbt_slo_s, local_prefill=True)
    return placed(decision)


def fitted(view: ClusterView) -> HandoffCoefficients:
    return view.handoffs.coefficients(handoff_prior(0.002, 32 * 46_080, 1e9))


def test_the_hand_off_fit_recovers_the_measured_line_and_drops_bad_samples() -> None:
    times = HandoffTimes(window=64)
    times.add([*MEASURED, (-1, 0.5), (3, float("nan")), (3, -0.1)])
    coef = times.coefficients(HandoffCoefficients(0.004, 0.0015))
    assert coef.base_s == pytest.approx(0.03, rel=0.02)
    assert coef.per_block_s == pytest.approx(0.002, rel=0.02)
    # With nothing measured the prior stands: two fixed costs and the bytes at the bandwidth;
    # with hand-offs of one size only, it settles the slope they leave open.
    prior = handoff_prior(0.002, 1_000_000, 1e9)
    assert HandoffTimes().coefficients(prior) == HandoffCoefficients(0.004, 0.001)
    one_size = HandoffTimes()
    one_size.add([(16, 0.1)] * 8)
    coef = one_size.coefficients(prior)
    assert coef.seconds(16) == pytest.approx(0.1, rel=0.01) and coef.per_block_s > 0


def test_prefer_local_weighs_the_pause_of_every_decoding_sequence() -> None:
    cost = PrefillCost("d", 0.0, 0.0, 0.2, 0, 0, (), 0)
    remote = Disaggregated(ttft_s=0.2, handoff_s=0.05)
    assert prefer_local(LocalPrefill(cost, 0.04, 1, 0.02), remote, None)  # 0.24 < 0.25
    assert not prefer_local(LocalPrefill(cost, 0.06, 1, 0.02), remote, None)  # 0.26
    assert not prefer_local(LocalPrefill(cost, 0.03, 2, 0.02), remote, None)  # 0.26
    # A pause that would stretch the node's steps past the objective is never taken.
    assert not prefer_local(LocalPrefill(cost, 0.0, 0, 0.02), remote, 0.01)


def test_a_streams_pause_is_weighed_against_the_wait_the_request_saves() -> None:
    cost = PrefillCost("d", 0.0, 0.0, 0.2, 0, 0, (), 0)
    queued = Disaggregated(ttft_s=5.0, handoff_s=0.05)  # the prefill node is far behind
    weight = CostParams().local_prefill_stall_weight
    assert weight > 1  # a second of a watched stream's stall costs more than one of waiting
    long_pause = LocalPrefill(cost, 0.3, 1, 0.02, weight)
    assert prefer_local(long_pause, queued, None)
    idle = Disaggregated(ttft_s=0.2, handoff_s=0.05)
    assert not prefer_local(long_pause, idle, None)
    assert prefer_local(LocalPrefill(cost, 0.3, 0, 0.02, weight), idle, None)  # nobody paused
    # An operator's absolute bound still holds, whatever the wait.
    assert not prefer_local(long_pause, queued, None, max_pause_s=0.1)
    # Through placement: a prompt that would pause a stream goes to an idle prefill node, and
    # stays on the decode node when the prefill node is far behind (its queue's wait is
    # predicted): no fixed bound on the pause decides it.
    tokens = 400
    assert pause_seconds(COEF, tokens, 0, STEP) > 0.1
    assert not decide(cluster(1), tokens).local
    assert decide(cluster(0), tokens).local
    behind = cluster(1)
    behind.update(node("p", "prefill", queued_tokens=20_000))
    assert decide(behind, tokens).local


def test_a_few_short_steps_of_the_prefill_node_do_not_make_a_long_pause_look_free() -> None:
    # All a prefill node has run while the decode node took the short prompts itself: three
    # short steps, the longest timed fastest (a shared host's noise). Their fit has no slope,
    # and priced by it a 1,100-token prompt would pause the decode node's stream for nothing.
    view = cluster(1)
    short = [StepSample(1, 25, 0, 0.035), StepSample(1, 35, 0, 0.033), StepSample(1, 45, 0, 0.030)]
    view.timing.add("p", "prefill", short)
    assert view.timing.coefficients("p", "prefill").per_token_s == 0
    assert not view.timing.settled("p", "prefill")
    decision = decide(view, 1100)
    assert not decision.local and decision.prefill_node == "p"
    # Once the node's own fit is settled, it prices the pause (here: free, so local).
    view.timing.add("p", "prefill", short * 6)
    assert view.timing.settled("p", "prefill")
    assert decide(view, 1100).local


@pytest.mark.parametrize("running", [1, 3])
def test_a_fresh_prompt_is_prefilled_locally_up_to_the_break_even_length(running: int) -> None:
    view = cluster(running)
    weight = view.costs.local_prefill_stall_weight
    limit = break_even_tokens(COEF, STEP, 0.0, running, fitted(view), 32, stall_weight=weight)
    assert 1 < limit < 10_000
    short, long = decide(view, limit), decide(cluster(running), limit + 1)
    assert short.local and short.prefill_node == "d" and short.decode_nodes == ["d"]
    assert not long.local and long.prefill_node == "p" and long.decode_nodes == ["d"]


def test_the_break_even_moves_with_what_is_measured() -> None:
    slow_link = [(blocks, 0.03 + 0.02 * blocks) for blocks in range(1, 65)]
    one = break_even_tokens(COEF, STEP, 0.0, 1, fitted(cluster(1)), 32)
    slow = break_even_tokens(COEF, STEP, 0.0, 1, fitted(cluster(1, slow_link)), 32)
    busier = break_even_tokens(COEF, STEP, 0.0, 4, fitted(cluster(4)), 32)
    assert busier < one < slow
    # Unbounded, an idle node with no objective keeps every prompt: nobody waits for it now.
    idle = break_even_tokens(COEF, STEP, 0.0, 0, fitted(cluster(0)), 32, limit=1 << 16)
    assert idle == 1 << 16
    # An objective on the time between tokens bounds the pause a prompt may cause.
    bounded = break_even_tokens(COEF, STEP, 0.02, 0, fitted(cluster(0)), 32, tbt_slo_s=0.1)
    assert pause_seconds(COEF, bounded, 0, STEP) <= 0.08 < pause_seconds(COEF, bounded + 1, 0, STEP)


def test_an_idle_decode_node_keeps_only_prompts_it_computes_within_its_bound() -> None:
    """Streams handed to an idle node while it prefills a long prompt would wait for its long
    steps, which no forecast of the node's sequences counts: a prompt whose compute there
    exceeds the bound goes to the prefill node, one token either side of it."""
    bound_s = CostParams().local_prefill_max_idle_compute_s
    assert bound_s is not None
    longest = break_even_tokens(
        COEF, STEP, 0.0, 0, fitted(cluster(0)), 32, max_idle_compute_s=bound_s
    )
    assert prefill_seconds(COEF, longest, 0, STEP) <= bound_s
    assert prefill_seconds(COEF, longest + 1, 0, STEP) > bound_s
    assert decide(cluster(0), longest).local
    assert not decide(cluster(0), longest + 1).local
    assert not decide(cluster(0), 4000).local


def test_a_long_prompt_the_decode_node_caches_is_prefilled_there() -> None:
    tokens = 4000
    assert not decide(cluster(2), tokens).local
    held = [PrefixHolder("d", "dram", (tokens - 1) // 32)]
    on_d = decide(cluster(2), tokens, held)
    assert on_d.local and on_d.num_cached_tokens == (tokens - 1) // 32 * 32 and not on_d.pulls


def test_nothing_is_prefilled_locally_unless_both_sides_take_part() -> None:
    view = cluster(0)
    ask = PlacementRequest(64, 8, request_id="r")
    assert not placed(place(ask, view, [], NOW)).local  # the scheduler's option is off
    view.update(node("d", "decode", free_blocks=1000))  # the node does not take prefill tasks
    assert not decide(view, 64).local
    # A node without room for the request cannot take it either way.
    view.update(node("d", "decode", free_blocks=1, local_prefill=True))
    assert not isinstance(place(ask, view, [], NOW, local_prefill=True), Rejection)
    assert not placed(place(ask, view, [], NOW, local_prefill=True)).local


def test_a_sequence_predicted_done_since_the_heartbeat_pauses_nobody() -> None:
    view = cluster(1)
    tokens = 1000  # computed within the idle node's bound, pausing a stream past its own
    assert not decide(view, tokens).local  # one sequence decoding: a hand-off is cheaper
    # The same node a second after a heartbeat that had its one sequence a token from its end.
    view.update(
        node(
            "d", "decode", running_seqs=1, free_blocks=1000, local_prefill=True,
            finishing=((1, 100),), last_seen=NOW - 1.0,
        )
    )  # fmt: skip
    assert decide(view, tokens).local
