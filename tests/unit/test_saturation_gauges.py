"""The saturation gauges as the scheduler exports them: heartbeats in through its feed, a
reading on its tick, ``crescent_saturation`` and ``crescent_role_saturation`` out."""

from __future__ import annotations

import asyncio

import pytest

from services.scheduler.cluster import ClusterView
from services.scheduler.feed import ClusterFeed
from services.scheduler.metrics import SchedulerMetrics
from services.scheduler.policy import Placement, PlacementRequest
from services.scheduler.recent import RecentPlacements
from services.scheduler.saturation import Objectives, Saturation, measure
from services.scheduler.timing import StepTimes
from shared import subjects
from shared.cluster_messages import NodeStatus, StepSample
from tests.unit.scheduler_nodes import COEF

OBJECTIVES = Objectives(ttft_s=1.0, tbt_s=0.05)


def hear(feed: ClusterFeed, *beats: NodeStatus) -> None:
    async def send() -> None:
        for status in beats:
            await feed.on_heartbeat(subjects.heartbeats(status.role, status.node_id), status)

    asyncio.run(send())


def gauge(metrics: SchedulerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_heartbeats_become_the_gauges_of_each_node_and_role() -> None:
    view = ClusterView(3.0, timing=StepTimes(COEF))
    feed = ClusterFeed(view, RecentPlacements())
    metrics = SchedulerMetrics(view, reference_prompt_tokens=200)
    steps = [StepSample(2, 2, 300, 0.02), StepSample(2, 2, 302, 0.03)]
    hear(
        feed,
        NodeStatus(node_id="p0", role="prefill", queued_tokens=900),
        NodeStatus(node_id="p1", role="prefill"),
        NodeStatus(node_id="d0", role="decode", running_seqs=2, step_samples=steps),
    )
    metrics.saturated(measure(view, feed.steps, metrics.typical.tokens(), OBJECTIVES, _now(view)))
    busy = gauge(metrics, "crescent_saturation", role="prefill", node="p0")
    idle = gauge(metrics, "crescent_saturation", role="prefill", node="p1")
    assert busy is not None and idle is not None and busy > idle > 0
    assert gauge(metrics, "crescent_saturation", role="decode", node="d0") == pytest.approx(0.5)
    assert gauge(metrics, "crescent_role_saturation", role="prefill") == pytest.approx(
        (busy + idle) / 2
    )
    assert gauge(metrics, "crescent_role_saturation", role="decode") == pytest.approx(0.5)


def test_a_new_reading_replaces_the_last_one_nodes_gone_included() -> None:
    view = ClusterView(3.0)
    metrics = SchedulerMetrics(view)
    metrics.saturated(Saturation({"p0": ("prefill", 0.7), "d0": ("decode", 0.2)},
                                 {"prefill": 0.7, "decode": 0.2}))  # fmt: skip
    assert gauge(metrics, "crescent_saturation", role="prefill", node="p0") == 0.7
    metrics.saturated(Saturation({"d0": ("decode", 0.4)}, {"decode": 0.4}))
    assert gauge(metrics, "crescent_saturation", role="prefill", node="p0") is None
    assert gauge(metrics, "crescent_role_saturation", role="prefill") is None
    assert gauge(metrics, "crescent_role_saturation", role="decode") == 0.4


def test_placements_make_the_typical_prompt_the_gauges_price() -> None:
    metrics = SchedulerMetrics(ClusterView(3.0), reference_prompt_tokens=300)
    assert metrics.typical.tokens() == (300, 0)
    placement = Placement("p0", ["d0"], num_cached_tokens=64)
    for prompt in (100, 200):
        metrics.placed(placement, PlacementRequest(num_prompt_tokens=prompt, max_tokens=8))
    assert metrics.typical.tokens() == (150, 64)


def _now(view: ClusterView) -> float:
    """The clock the feed stamped the heartbeats with."""
    return max(node.last_seen for node in view.nodes.values())
