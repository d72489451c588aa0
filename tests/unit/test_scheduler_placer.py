"""The figures the scheduler prices before it places (``placer.Placer``): the refusal of a
hopeless overload, the budget of a lookup, the TTFT floor, and a request's terms."""

from __future__ import annotations

import pytest

from services.scheduler.placer import OVERLOAD_LOOKUP_S, PlacementOptions, PlacementQuery, Placer
from services.scheduler.policy import Placement, PlacementRequest
from shared.messages import GenerateRequest, SamplingSpec
from tests.unit.scheduler_nodes import NOW, cluster, node

LONG = PlacementRequest(num_prompt_tokens=2000, max_tokens=8, request_id="r1")


def placer(*prefill_queues: int, **options: object) -> Placer:
    loads = [node(f"p{i}", "prefill", queued_tokens=q) for i, q in enumerate(prefill_queues)]
    return Placer(cluster(*loads, node("d", "decode")), PlacementOptions(**options))  # type: ignore[arg-type]


def test_an_overload_no_cache_could_save_is_hopeless() -> None:
    busy = placer(20_000)
    refusal = busy.hopeless(PlacementQuery(LONG, slo_s=1.0), NOW)
    assert refusal is not None and (refusal.status, refusal.cause) == (429, "ttft_slo")
    assert busy.hopeless(PlacementQuery(LONG, slo_s=1.0, resumed=True), NOW) is None
    assert busy.hopeless(PlacementQuery(LONG), NOW) is None  # no objective
    assert placer(20_000, round_robin=True).hopeless(PlacementQuery(LONG, slo_s=1.0), NOW) is None
    # Idle: the whole prompt cached would meet the objective, so the lookup is worth asking.
    assert placer(0).hopeless(PlacementQuery(LONG, slo_s=1.0), NOW) is None


def test_only_a_request_that_needs_the_cache_gets_a_bounded_lookup() -> None:
    # Behind 100 queued tokens, 2,000 computed take over 2 s: only a cached prefix lets them
    # meet 1 s.
    tight = placer(100, slo_s=1.0)
    assert tight.lookup_budget(PlacementQuery(LONG), NOW) == OVERLOAD_LOOKUP_S
    assert tight.lookup_budget(PlacementQuery(LONG, resumed=True), NOW) is None
    assert placer(100, slo_s=5.0).lookup_budget(PlacementQuery(LONG), NOW) is None
    assert placer(100).lookup_budget(PlacementQuery(LONG), NOW) is None  # no objective
    # An idle node starts it at once, so it is let in whatever the catalogue answers.
    assert placer(0, slo_s=1.0).lookup_budget(PlacementQuery(LONG), NOW) is None


def test_a_request_an_idle_node_would_start_at_once_is_let_in_past_the_objective() -> None:
    # 2,000 tokens computed take about 2 s, over the 1 s objective: refusing could not make
    # them sooner, and a fit that overestimates would otherwise never be corrected.
    idle = placer(0, slo_s=1.0).decide(PlacementQuery(LONG, slo_s=1.0), [], (), NOW)
    assert isinstance(idle, Placement) and idle.predicted_ttft_s > 1.0
    queued = placer(100, slo_s=1.0).decide(PlacementQuery(LONG, slo_s=1.0), [], (), NOW)
    assert not isinstance(queued, Placement) and queued.cause == "ttft_slo"


def test_the_ttft_floor_is_one_cached_token_on_the_least_queued_node() -> None:
    assert placer(0).ttft_floor(NOW) == 0.0  # no objective: nothing to compare it with
    floor = placer(5000, 200, slo_s=1.0).ttft_floor(NOW)
    assert 0 < floor < placer(5000, 400, slo_s=1.0).ttft_floor(NOW)  # the shorter queue
    # A node that would start a request at once lets any in: nothing to refuse on.
    assert placer(5000, 0, slo_s=1.0).ttft_floor(NOW) == 0.0
    assert placer(slo_s=1.0).ttft_floor(NOW) == 0.0  # no prefill node at all


def test_pricing_a_figure_never_moves_the_round_robin_turn() -> None:
    def turns(price: bool) -> list[str]:
        rr = placer(0, 0, 0, slo_s=10.0, round_robin=True)
        picked = []
        for _ in range(3):
            if price:
                rr.ttft_floor(NOW)
                rr.lookup_budget(PlacementQuery(LONG), NOW)
            decision = rr.decide(PlacementQuery(LONG), [], (), NOW)
            assert isinstance(decision, Placement)
            picked.append(decision.prefill_node)
        return picked

    assert turns(price=True) == turns(price=False)
    assert len(set(turns(price=False))) == 3


def test_a_requests_own_objectives_are_kept_when_tighter() -> None:
    p = placer(0, slo_s=1.0, tbt_slo_s=0.1)
    own = GenerateRequest(
        request_id="r-own",
        tenant="t",
        prompt_token_ids=[1] * 100,
        sampling=SamplingSpec(max_tokens=4, ttft_deadline=1000.4, tbt_slo_s=0.05),
    )
    query = p.query(own, wall_now=1000.0)
    assert query.slo_s == pytest.approx(0.4) and query.tbt_slo_s == 0.05
    assert (query.ask.num_prompt_tokens, query.ask.tbt_slo_s) == (100, 0.05)
    plain = GenerateRequest(
        request_id="r", tenant="t", prompt_token_ids=[1], sampling=SamplingSpec(max_tokens=4)
    )
    assert (p.query(plain, 1000.0).slo_s, p.query(plain, 1000.0).tbt_slo_s) == (1.0, 0.1)
