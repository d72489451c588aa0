"""The fairness benchmark's own arithmetic: its arrivals and the figures it prints."""

from __future__ import annotations

import argparse
import asyncio

import httpx
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.fairness import Phase, arrivals, p90, phase_totals, render
from bench.overload import Shot


def test_arrivals_are_seeded_within_the_window_and_near_the_rate() -> None:
    times = arrivals(2.0, 500.0, seed=3)
    assert times == arrivals(2.0, 500.0, seed=3)
    assert times == sorted(times) and times[0] > 0 and times[-1] < 500.0
    assert 900 < len(times) < 1100


def test_the_light_tenants_p90_rise_compares_its_rounds_alone_and_beside() -> None:
    def shots(*ttfts: float) -> list[Shot]:
        return [Shot(status=200, ttft_s=t) for t in ttfts]

    alone = Phase(False, {"light": shots(*[0.1] * 9, 0.2)})
    beside = Phase(True, {"light": shots(*[0.1] * 9, 0.3), "heavy": [Shot(status=429)]})
    args = argparse.Namespace(light_share=0.1, ratio=4.0, rounds=1, seconds=60.0)
    text = render(2.0, [alone, beside], args)
    assert p90([0.1] * 9 + [0.2]) == 0.2
    assert "p90 TTFT rise: +50.0%" in text
    assert "refused with 429 1" in text


def test_phase_totals_read_the_gateways_phase_histogram() -> None:
    registry = CollectorRegistry()
    phases = Histogram("crescent_gateway_request_phase_seconds", "-", ["phase"], registry=registry)
    phases.labels("parse").observe(0.5)
    phases.labels("parse").observe(0.25)
    phases.labels("placement").observe(1.0)
    text = generate_latest(registry).decode()

    async def read() -> dict[str, tuple[float, float]]:
        transport = httpx.MockTransport(lambda _: httpx.Response(200, text=text))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            return await phase_totals(http)

    assert asyncio.run(read()) == {"parse": (0.75, 2.0), "placement": (1.0, 1.0)}
