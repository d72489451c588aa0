"""What ``crescent plan --live`` reads of a running cluster, from the gateway's own metrics and
status code: the arrival rate, the lengths, the cached share and the nodes running."""

from __future__ import annotations

from typing import Any

import pytest

from crescent.plan.observe import Counts, counts, observe, recent_lengths, running
from crescent.plan.workload import Lengths
from services.gateway.metrics import GatewayMetrics, Served
from services.gateway.status import StatusBoard
from shared.cluster_messages import NodeStatus

CHAT = "/v1/chat/completions"


def serve(metrics: GatewayMetrics, requests: int, prompt: int, output: int, cached: int) -> None:
    """``requests`` answered requests of these token counts, as the gateway counts them."""
    for _ in range(requests):
        metrics.requests.labels(CHAT, "200").inc()
        metrics.e2e.observe(0.5)
    metrics.prompt_tokens.inc(requests * prompt)
    metrics.generation_tokens.inc(requests * output)
    metrics.cached_tokens.inc(requests * cached)


def scrape(metrics: GatewayMetrics) -> str:
    return metrics.render().decode()


def test_arrivals_are_generation_requests_refused_or_not_but_not_malformed() -> None:
    metrics = GatewayMetrics()
    for endpoint, status, times in [
        (CHAT, "200", 5), ("/v1/completions", "429", 2), ("/v1/responses", "503", 1),
        (CHAT, "400", 7), ("/v1/models", "200", 9), ("/metrics", "200", 3),
    ]:  # fmt: skip
        metrics.requests.labels(endpoint, status).inc(times)
    assert counts(scrape(metrics)).arrivals == 8


def test_a_window_gives_the_rate_the_means_and_the_cached_share() -> None:
    metrics = GatewayMetrics()
    serve(metrics, 10, prompt=100, output=20, cached=0)
    before = scrape(metrics)
    serve(metrics, 30, prompt=200, output=40, cached=50)
    seen = observe([before], [scrape(metrics)], window_s=15.0, statuses=[])
    assert seen.counted == Counts(30, 30, 6000, 1500, 1200)
    assert seen.rate_per_s == 2.0
    assert seen.mean_lengths() == (200, 40)
    assert seen.cached_share == 0.25


def test_a_gateway_that_started_again_counts_from_zero() -> None:
    old, new = GatewayMetrics(), GatewayMetrics()
    serve(old, 50, prompt=100, output=10, cached=0)
    serve(new, 4, prompt=100, output=10, cached=0)
    seen = observe([scrape(old)], [scrape(new)], window_s=2.0, statuses=[])
    assert seen.counted.arrivals == 4 and seen.counted.prompt_tokens == 400


def test_gateways_add_up() -> None:
    a, b = GatewayMetrics(), GatewayMetrics()
    before = [scrape(a), scrape(b)]
    serve(a, 6, prompt=10, output=1, cached=0)
    serve(b, 4, prompt=10, output=1, cached=0)
    seen = observe(before, [scrape(a), scrape(b)], window_s=5.0, statuses=[])
    assert seen.rate_per_s == 2.0


def status_document(
    served: list[Served], roles: dict[str, str], silent: str = ""
) -> dict[str, Any]:
    board = StatusBoard(heartbeat_timeout_s=3.0)
    for node_id, role in roles.items():
        board.beat(NodeStatus(node_id=node_id, role=role), now=0.0 if node_id == silent else 9.0)
    return board.snapshot(10.0, 1000.0, served, {"id": "gateway-0"})


def test_lengths_and_nodes_from_the_status_document() -> None:
    served = [
        Served(900.0, ttft_s=0.25, tpot_s=0.02, e2e_s=0.25 + 0.02 * 9, prompt_tokens=120,
               cached_tokens=0),
        Served(901.0, ttft_s=0.1, tpot_s=None, e2e_s=0.1, prompt_tokens=40, cached_tokens=0),
        Served(902.0, ttft_s=None, tpot_s=None, e2e_s=3.0, prompt_tokens=70, cached_tokens=0),
    ]  # fmt: skip
    roles = {"p0": "prefill", "p1": "prefill", "p2": "prefill", "d0": "decode", "s": "scheduler"}
    doc = status_document(served, roles, silent="p2")
    # Newest first; the request that never produced a token tells no output length.
    assert recent_lengths(doc) == (Lengths(40, 1), Lengths(120, 10))
    assert running(doc) == (2, 1)


def test_the_workload_to_plan_for() -> None:
    metrics = GatewayMetrics()
    before = scrape(metrics)
    serve(metrics, 20, prompt=300, output=30, cached=100)
    after = scrape(metrics)
    sample = [Served(900.0, 0.2, 0.01, 0.2 + 0.01 * 4, 64, 0)]
    seen = observe([before], [after], 10.0, [status_document(sample, {"p": "prefill"})])
    workload = seen.workload(requests=500, seed=3)
    assert workload is not None
    assert workload.mix == (Lengths(64, 5),)  # the sample, when there is one
    assert (workload.rate_per_s, workload.requests, workload.seed) == (2.0, 500, 3)
    assert workload.shared_share == pytest.approx(1 / 3)
    bare = observe([before], [after], 10.0, [status_document([], {})])
    assert bare.workload(100) is not None
    assert bare.workload(100).mix == (Lengths(300, 30),)  # type: ignore[union-attr]
    idle = observe([after], [after], 10.0, [status_document([], {})])
    assert idle.workload(100) is None
