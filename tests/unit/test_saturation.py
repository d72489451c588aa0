"""Each node's saturation (its role's figure over the objective) and each role's figure."""

from __future__ import annotations

import pytest

from services.scheduler.calibration import MIN_SAMPLES
from services.scheduler.config import SchedulerSettings
from services.scheduler.saturation import (
    REFERENCE_PROMPT_TOKENS,
    TBT_WINDOW_S,
    DecodeSteps,
    Objectives,
    TypicalPrompt,
    decoding_seqs,
    measure,
    role_figure,
)
from shared.cluster_messages import StepSample
from tests.unit.scheduler_nodes import COEF, NOW, cluster, node

#: 2 s to the first token, 100 ms between tokens.
OBJECTIVES = Objectives(ttft_s=2.0, tbt_s=0.1)
#: A 100-token prompt, nothing cached: one step of 10 ms + 100 × 1 ms under ``COEF``.
PROMPT = (100, 0)
PROMPT_S = COEF.base_s + 100 * COEF.per_token_s


def decode_steps(seconds: float, seqs: int = 4, count: int = 8) -> list[StepSample]:
    """``count`` decode steps of ``seqs`` sequences (one token each) taking ``seconds``."""
    return [StepSample(seqs, seqs, 500, seconds)] * count


def test_idle_nodes_are_near_zero() -> None:
    view = cluster(node("p0", "prefill"), node("d0", "decode"))
    reading = measure(view, DecodeSteps(), PROMPT, OBJECTIVES, NOW)
    # An idle prefill node is at its floor: the typical prompt's compute, no wait.
    assert reading.nodes["p0"] == ("prefill", pytest.approx(PROMPT_S / OBJECTIVES.ttft_s))
    assert reading.nodes["p0"][1] < 0.1
    assert reading.nodes["d0"] == ("decode", 0.0)  # decoded nothing lately
    assert reading.roles == {"prefill": reading.nodes["p0"][1], "decode": 0.0}


def test_a_prefill_nodes_ratio_grows_with_its_queue() -> None:
    loads = [0, 500, 2000, 8000]
    view = cluster(*(node(f"p{q}", "prefill", queued_tokens=q) for q in loads))
    reading = measure(view, DecodeSteps(), PROMPT, OBJECTIVES, NOW)
    ratios = [reading.nodes[f"p{q}"][1] for q in loads]
    assert ratios == sorted(ratios) and len(set(ratios)) == len(ratios), ratios
    # 8,000 queued tokens: some 8 s of steps before the prompt, four times the objective.
    assert ratios[-1] > 1.0 > ratios[0]
    # Tokens placed since the node's last heartbeat wait in its queue as well.
    view.nodes["p0"].placed_tokens = 2000
    assert measure(view, DecodeSteps(), PROMPT, OBJECTIVES, NOW).nodes["p0"][1] == ratios[2]


def test_a_prefill_nodes_ratio_is_stretched_by_its_measured_misses() -> None:
    view = cluster(node("p0", "prefill", queued_tokens=500))
    before = measure(view, DecodeSteps(), PROMPT, OBJECTIVES, NOW).nodes["p0"][1]
    view.calibration.add("p0", [(1.0, 2.0)] * MIN_SAMPLES, NOW)  # took twice the prediction
    after = measure(view, DecodeSteps(), PROMPT, OBJECTIVES, NOW).nodes["p0"][1]
    assert after == pytest.approx(2 * before)


def test_a_cached_typical_prefix_is_not_priced_as_compute() -> None:
    view = cluster(node("p0", "prefill"))
    cold = measure(view, DecodeSteps(), (640, 0), OBJECTIVES, NOW).nodes["p0"][1]
    warm = measure(view, DecodeSteps(), (640, 512), OBJECTIVES, NOW).nodes["p0"][1]
    assert warm < cold / 4


def test_a_decode_nodes_ratio_grows_with_its_time_between_tokens() -> None:
    view = cluster(node("d-fast", "decode"), node("d-slow", "decode"))
    steps = DecodeSteps()
    steps.add("d-fast", decode_steps(0.02), NOW)
    steps.add("d-slow", decode_steps(0.06), NOW)
    reading = measure(view, steps, PROMPT, OBJECTIVES, NOW)
    assert reading.nodes["d-fast"] == ("decode", pytest.approx(0.2))
    assert reading.nodes["d-slow"] == ("decode", pytest.approx(0.6))
    steps.add("d-slow", decode_steps(0.18), NOW + 1)  # slower lately: the mean follows
    assert steps.tbt_s("d-slow", NOW + 1) == pytest.approx(0.12)


def test_steps_heard_before_the_window_no_longer_count() -> None:
    steps = DecodeSteps()
    steps.add("d0", decode_steps(0.05), NOW)
    steps.add("d0", decode_steps(0.01, count=2), NOW + TBT_WINDOW_S / 2)
    assert steps.tbt_s("d0", NOW + TBT_WINDOW_S) > 0.04
    assert steps.tbt_s("d0", NOW + TBT_WINDOW_S + 1) == pytest.approx(0.01)
    assert steps.tbt_s("d0", NOW + 2 * TBT_WINDOW_S) == 0.0  # idle again: back to zero
    steps.add("d0", [], NOW + 2 * TBT_WINDOW_S)
    assert steps.tbt_s("d0", NOW + 2 * TBT_WINDOW_S) == 0.0


def test_a_steps_tokens_weigh_its_time_and_a_prompts_chunk_is_no_token() -> None:
    steps = DecodeSteps()
    # One stream alone at 10 ms, then eight together at 40 ms: most tokens waited 40 ms.
    steps.add("d0", [StepSample(1, 1, 100, 0.01), StepSample(8, 8, 800, 0.04)], NOW)
    assert steps.tbt_s("d0", NOW) == pytest.approx((0.01 + 8 * 0.04) / 9)
    # A local prefill alone on the node makes no token between tokens ...
    assert decoding_seqs(StepSample(1, 400, 0, 0.5)) == 0
    # ... and beside three decoding streams it is one sequence of four.
    assert decoding_seqs(StepSample(4, 403, 900, 0.5)) == 3
    steps.add("d1", [StepSample(1, 400, 0, 0.5)], NOW)
    assert steps.tbt_s("d1", NOW) == 0.0


def test_a_roles_figure_is_the_mean_over_the_nodes_that_take_work() -> None:
    view = cluster(
        node("d0", "decode"),
        node("d1", "decode"),
        node("d2", "decode"),
        node("d-draining", "decode", draining=True),
        node("d-stuck", "decode", healthy=False),
        node("d-gone", "decode", last_seen=NOW - 10),
    )
    steps = DecodeSteps()
    for node_id, seconds in (("d0", 0.05), ("d1", 0.1), ("d2", 0.15), ("d-draining", 0.5)):
        steps.add(node_id, decode_steps(seconds), NOW)
    steps.add("d-stuck", decode_steps(0.9), NOW)
    reading = measure(view, steps, PROMPT, OBJECTIVES, NOW)
    assert reading.roles["decode"] == pytest.approx(1.0)  # (0.5 + 1.0 + 1.5) / 3
    # The nodes that take no work keep their own gauge; a node silent past the timeout none.
    assert reading.nodes["d-draining"][1] == pytest.approx(5.0)
    assert reading.nodes["d-stuck"][1] == pytest.approx(9.0)
    assert "d-gone" not in reading.nodes
    assert "prefill" not in reading.roles  # no prefill node: no figure, not an idle one
    assert role_figure([0.5, 1.5]) == 1.0


def test_unset_objectives_fall_back_to_the_reference_values() -> None:
    unset = SchedulerSettings(ttft_slo_ms=None, tbt_slo_ms=None)
    assert unset.saturation_objectives() == Objectives(
        ttft_s=unset.saturation_ttft_ms / 1000, tbt_s=unset.saturation_tbt_ms / 1000
    )
    chosen = SchedulerSettings(saturation_ttft_ms=400, saturation_tbt_ms=40)
    assert chosen.saturation_objectives() == Objectives(0.4, 0.04)
    # With the objectives set, the gauges are read against them.
    both = SchedulerSettings(ttft_slo_ms=800, tbt_slo_ms=50, saturation_ttft_ms=400)
    assert both.saturation_objectives() == Objectives(0.8, 0.05)
    view = cluster(node("p0", "prefill", queued_tokens=1000))
    loose = measure(view, DecodeSteps(), PROMPT, unset.saturation_objectives(), NOW)
    tight = measure(view, DecodeSteps(), PROMPT, chosen.saturation_objectives(), NOW)
    assert tight.nodes["p0"][1] == pytest.approx(loose.nodes["p0"][1] * 5)


def test_the_typical_prompt_is_the_mean_of_the_last_placements() -> None:
    typical = TypicalPrompt(REFERENCE_PROMPT_TOKENS, window=4)
    assert typical.tokens() == (REFERENCE_PROMPT_TOKENS, 0)  # nothing placed yet
    for prompt, cached in ((100, 0), (300, 256)):
        typical.add(prompt, cached)
    assert typical.tokens() == (200, 128)
    for _ in range(4):  # the window slides past the first two
        typical.add(40, 32)
    assert typical.tokens() == (40, 32)


def test_nodes_the_view_forgot_leave_the_decode_steps() -> None:
    view = cluster(node("d0", "decode"))
    steps = DecodeSteps()
    steps.add("d0", decode_steps(0.05), NOW)
    steps.add("d-old", decode_steps(0.05), NOW)
    measure(view, steps, PROMPT, OBJECTIVES, NOW)
    assert steps.tbt_s("d-old", NOW) == 0.0 and steps.tbt_s("d0", NOW) > 0
