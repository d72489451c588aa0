"""Which prompts an engine step computes: by deadline and priority, with the step shared, so a
short prompt overtakes a long one mid-prefill and nothing starves."""

from __future__ import annotations

import time

import pytest

from shared.engine.engine import LLMEngine
from shared.engine.prefill_order import (
    DEFAULT_TTFT_S,
    LATE_GRACE_S,
    PRIORITY_STEP_S,
    feasible_first,
    share_budget,
    urgency,
)
from shared.engine.tenant_share import (
    MIN_CONTENDED_STEP_TOKENS,
    TenantService,
    contended_budget,
    favour,
    in_turns,
)
from shared.kv.hashing import scope_salt
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts, run_alone

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def test_prompts_that_fit_a_share_finish_and_the_most_urgent_takes_the_rest() -> None:
    # The long prompt goes on in a step no longer than twice the short one's tokens (at least
    # the minimum share).
    assert share_budget([1000, 20], 256, 16) == [20, 20]
    assert share_budget([1000, 120], 256, 16) == [120, 120]
    assert share_budget([1000, 20], 256, 64) == [64, 20]
    # Long prompts are not slowed down together: the most urgent takes the whole step.
    assert share_budget([1000, 1000], 256, 16) == [256, 0]
    assert share_budget([500, 40, 500, 30], 256, 16) == [70, 40, 0, 30]
    # A prompt just over its share waits, like a long one.
    assert share_budget([1000, 140], 256, 16) == [256, 0]
    assert share_budget([5, 7], 256, 16) == [5, 7]
    # When every prompt fits the step, every prompt is computed whole in it.
    assert share_budget([200, 20], 256, 16) == [200, 20]
    assert share_budget([], 256, 16) == []
    assert share_budget([10], 0, 16) == [0]
    # A budget under two minimum shares is shared in halves.
    assert share_budget([1000, 12], 64, 128) == [32, 12]
    # Without a minimum share: in order, whole steps.
    assert share_budget([1000, 12], 256, 0) == [256, 0]


def test_deadlines_order_prompts_and_priority_moves_them() -> None:
    now = 1_000_000.0
    assert urgency(0, now + 1, now) < urgency(0, now + 2, now - 100)
    assert urgency(0, 0.0, now) == now + DEFAULT_TTFT_S  # no deadline: due after a while
    assert urgency(-1, 0.0, now) == urgency(0, 0.0, now) - PRIORITY_STEP_S
    # Aging: a low-priority prompt that waited long enough comes before a new urgent one.
    assert urgency(5, 0.0, now) < urgency(-1, 0.0, now + 7)


def test_a_prompt_that_cannot_make_its_due_time_yields_for_a_while() -> None:
    now, token_s = 1_000_000.0, 0.01
    # 100 tokens take 1 s: due in 2 s it keeps its place; due in 0.5 s it cannot make it.
    assert feasible_first(now + 2, 100, now, token_s) == now + 2
    late = feasible_first(now + 0.5, 100, now, token_s)
    assert late > feasible_first(now + 3600, 100, now, token_s)  # after every feasible one
    assert late < feasible_first(now + 0.6, 100, now, token_s)  # in due order among them
    # Not measured yet: nobody yields. Late by the grace: it takes its place again.
    assert feasible_first(now + 0.5, 100, now, 0.0) == now + 0.5
    assert feasible_first(now - LATE_GRACE_S, 100, now, token_s) == now - LATE_GRACE_S


def run_all(
    engine: LLMEngine, started: tuple[str, ...] = ()
) -> tuple[list[str], dict[str, list[int]]]:
    """Steps until every request is done: the ids in the order their first token came out
    (but ``started``, which had theirs), and each one's tokens."""
    order: list[str] = list(started)
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.output_token_ids and out.request_id not in order:
                order.append(out.request_id)
            if out.finished:
                tokens[out.request_id] = out.output_token_ids
    return order[len(started) :], tokens


def test_a_short_prompt_overtakes_a_long_one_mid_prefill(make_engine: EngineFactory) -> None:
    long_prompt, short_prompt = prompts(1, 600, 600, seed=80)[0], prompts(1, 12, 12, seed=81)[0]
    engine = make_engine(num_kv_blocks=256, max_num_batched_tokens=64)
    engine.add_request("long", long_prompt, GREEDY)
    for _ in range(3):  # the long prompt is mid-prefill: 192 of its 600 tokens done
        engine.step()
    engine.add_request("short", short_prompt, GREEDY)
    steps_before = engine.stats.steps
    first: list[str] = []
    while not first:
        first = [o.request_id for o in engine.step() if o.output_token_ids]
    # The short prompt was done within a step, beside the long one, not after its 7 more.
    assert first == ["short"] and engine.stats.steps - steps_before == 1
    order, tokens = run_all(engine, started=("short",))
    assert order == ["long"]
    alone = make_engine(num_kv_blocks=256).generate([long_prompt], GREEDY)[0]
    assert tokens["long"] == alone.output_token_ids


def test_in_arrival_order_the_short_prompt_waits_for_the_long_one(
    make_engine: EngineFactory,
) -> None:
    long_prompt, short_prompt = prompts(1, 600, 600, seed=80)[0], prompts(1, 12, 12, seed=81)[0]
    engine = make_engine(num_kv_blocks=256, max_num_batched_tokens=64, prefill_order="arrival")
    engine.add_request("long", long_prompt, GREEDY)
    engine.step()
    engine.add_request("short", short_prompt, GREEDY)
    order, _ = run_all(engine)
    assert order == ["long", "short"]


def test_an_earlier_deadline_or_priority_goes_first_and_tokens_do_not_change(
    make_engine: EngineFactory,
) -> None:
    batch = prompts(3, 150, 150, seed=82)
    now = time.time()
    engine = make_engine(num_kv_blocks=256, max_num_batched_tokens=64)
    late, soon = (
        SamplingParams(**_greedy(ttft_deadline=now + 60)),
        SamplingParams(**_greedy(ttft_deadline=now + 1)),
    )
    urgent = SamplingParams(**_greedy(priority=-20))  # due 10 s before now
    engine.add_request("late", batch[0], late)
    engine.add_request("soon", batch[1], soon)
    engine.add_request("urgent", batch[2], urgent)
    order, tokens = run_all(engine)
    assert order == ["urgent", "soon", "late"]
    for rid, prompt in zip(("late", "soon", "urgent"), batch, strict=True):
        assert tokens[rid] == run_alone(make_engine, prompt, GREEDY)


def _greedy(**more: object) -> dict[str, object]:
    return {"max_tokens": 4, "temperature": 0.0, "ignore_eos": True, **more}


def test_a_prompt_past_reach_yields_to_one_that_can_still_make_it(
    make_engine: EngineFactory,
) -> None:
    # Neither prompt fits a share of the 64-token step, so without the rule the one due first
    # would take every step until it is done.
    late_prompt, fine_prompt = prompts(1, 600, 600, seed=82)[0], prompts(1, 200, 200, seed=83)[0]
    engine = make_engine(num_kv_blocks=256, max_num_batched_tokens=64)
    due_at_once = SamplingParams(
        max_tokens=4, temperature=0.0, ignore_eos=True, ttft_deadline=time.time() + 0.001
    )
    engine.add_request("late", late_prompt, due_at_once)
    for _ in range(3):  # mid-prefill, and the node's pace measured
        engine.step()
    assert engine.scheduler.prompt_token_s > 0
    in_a_minute = SamplingParams(
        max_tokens=4, temperature=0.0, ignore_eos=True, ttft_deadline=time.time() + 60
    )
    engine.add_request("fine", fine_prompt, in_a_minute)
    order, tokens = run_all(engine)
    assert order == ["fine", "late"]
    alone = make_engine(num_kv_blocks=256).generate([late_prompt, fine_prompt], GREEDY)
    assert [tokens["late"], tokens["fine"]] == [o.output_token_ids for o in alone]


def test_a_tenants_backlog_does_not_hold_back_another_tenants_prompt(
    make_engine: EngineFactory,
) -> None:
    heavy, light = scope_salt(b"server secret", "heavy"), scope_salt(b"server secret", "light")
    batch = prompts(5, 150, 150, seed=83)
    engine = make_engine(num_kv_blocks=256, max_num_batched_tokens=64)
    for i, prompt in enumerate(batch[:4]):
        engine.add_request(f"heavy-{i}", prompt, GREEDY, heavy)
    engine.step()  # the heavy tenant has been served; its backlog waits
    engine.add_request("light", batch[4], GREEDY, light)
    order, tokens = run_all(engine)
    # Turns: the light tenant's prompt comes right after the heavy one under way, not after
    # the heavy tenant's whole backlog (deadlines alone, all due alike, would put it last).
    assert order.index("light") <= 1
    assert tokens["light"] == run_alone(make_engine, batch[4], GREEDY)


def test_in_turns_takes_the_least_served_tenant_first() -> None:
    prompts_ = [("a", 1.0), ("a", 2.0), ("a", 3.0), ("b", 5.0), ("c", 4.0)]
    served = {"a": 900.0, "b": 10.0, "c": 10.0}.__getitem__
    ordered = in_turns(prompts_, lambda p: p[0], lambda p: p[1], served)
    assert ordered == [("c", 4.0), ("b", 5.0), ("a", 1.0), ("a", 2.0), ("a", 3.0)]
    one = in_turns(prompts_[:3][::-1], lambda p: p[0], lambda p: p[1], served)
    assert one == prompts_[:3]


def test_a_heavier_tenant_is_served_tokens_in_proportion_to_its_weight() -> None:
    # Two tenants, each with ten 100-token prompts waiting, neither served yet; "gold" has
    # weight 3. Over any prefix of the order, gold has about three times silver's tokens.
    prompts_ = [("gold", float(i)) for i in range(10)] + [("silver", float(i)) for i in range(10)]
    weights = {"gold": 3.0, "silver": 1.0}
    ordered = in_turns(
        prompts_,
        lambda p: p[0],
        lambda p: p[1],
        lambda t: 0.0,
        lambda p: 100,
        lambda p: weights[p[0]],
    )
    first_eight = [p[0] for p in ordered[:8]]
    assert first_eight.count("gold") == 6 and first_eight.count("silver") == 2
    # Each tenant's own prompts stay most urgent first.
    assert [p[1] for p in ordered if p[0] == "gold"] == [float(i) for i in range(10)]
    # Past service counts over the weight: silver, far behind, goes first.
    behind = in_turns(
        prompts_,
        lambda p: p[0],
        lambda p: p[1],
        {"gold": 3000.0, "silver": 0.0}.__getitem__,
        lambda p: 100,
        lambda p: weights[p[0]],
    )
    assert [p[0] for p in behind[:4]] == ["silver"] * 4


def test_service_decays_by_half_each_half_life() -> None:
    service = TenantService(half_life_s=10.0)
    service.add("a", 1000, now=100.0)
    assert service.served("a", 110.0) == pytest.approx(500.0)
    service.add("a", 500, now=110.0)
    assert service.served("a", 120.0) == pytest.approx(500.0)
    assert service.served("b", 120.0) == 0.0


def test_a_steps_prompt_tokens_are_bounded_in_time_only_while_tenants_share_the_node(
    make_engine: EngineFactory,
) -> None:
    heavy, light = scope_salt(b"server secret", "heavy"), scope_salt(b"server secret", "light")
    long_prompt = prompts(1, 600, 600, seed=84)[0]

    def first_chunks(light_served: int, light_waits: bool = False) -> dict[str, int]:
        engine = make_engine(num_kv_blocks=256, max_num_batched_tokens=64, tenant_step_s=0.02)
        engine.scheduler.prompt_token_s = 0.001  # 20 tokens in 0.02 s
        engine.scheduler.tenants.add(heavy, 1000, time.monotonic())
        engine.scheduler.tenants.add(light, light_served, time.monotonic())
        engine.add_request("heavy", long_prompt, GREEDY, heavy)
        if light_waits:
            engine.add_request("light", long_prompt[::-1], GREEDY, light)
        chunks = engine.scheduler.schedule().chunks
        return {c.seq.request_id: c.num_new for c in chunks}

    assert first_chunks(light_served=0) == {"heavy": 64}  # the heavy tenant alone: whole steps
    # Another tenant served lately: the heavy one's steps take 20 ms, so the other's next
    # prompt waits no longer than that; that prompt then has the step to itself.
    assert first_chunks(light_served=150) == {"heavy": 20}
    assert first_chunks(light_served=150, light_waits=True) == {"light": 64}


def test_the_favoured_tenant_keeps_its_grants_and_the_others_share_what_is_left() -> None:
    tenants = ["light", "heavy", "heavy", "light"]
    assert favour([10, 30, 30, 5], tenants, "light", cap=40) == [10, 25, 0, 5]
    assert favour([50, 30, 30, 5], tenants, "light", cap=40) == [50, 0, 0, 5]
    assert favour([0, 30, 30, 0], tenants, "light", cap=40) == [0, 30, 10, 0]


def test_a_contended_budget_takes_the_time_given_at_the_measured_pace() -> None:
    assert contended_budget(2048, 2, step_s=0.1, token_s=0.002) == 50
    assert contended_budget(2048, 1, step_s=0.1, token_s=0.002) == 2048  # one tenant
    assert contended_budget(2048, 3, step_s=0.0, token_s=0.002) == 2048  # off
    assert contended_budget(2048, 3, step_s=0.1, token_s=0.0) == 2048  # pace not measured
    assert contended_budget(2048, 2, step_s=0.1, token_s=0.1) == MIN_CONTENDED_STEP_TOKENS
    assert contended_budget(30, 2, step_s=0.1, token_s=0.002) == 30  # never more than given


def test_a_tenant_counts_as_active_until_its_service_decays_below_a_token() -> None:
    service = TenantService(half_life_s=10.0)
    service.add("a", 8, now=0.0)
    service.add("b", 1000, now=0.0)
    assert service.active(0.0) == {"a", "b"}
    assert service.active(29.0) == {"a", "b"}  # a: 8 / 2**2.9 > 1
    assert service.active(31.0) == {"b"}  # a: below one token
    assert service.active(31.0, waiting=["b", "c"]) == {"b", "c"}  # waiting now counts
    assert service.favoured(["a", "b", "c"], 29.0) == "c"  # never served
    assert service.favoured(["a", "b"], 29.0) == "a"
