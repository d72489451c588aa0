"""Fairness between tenants: one tenant's time to first token while another sends four times
its rate, against `crescent up` with two API keys (two tenants), side by side in one run.

First a closed loop of ``--clients`` streaming clients measures the sustainable rate R. The
light tenant then sends ``--light-share`` x R, the heavy one ``--ratio`` times that, each a
Poisson arrival of fresh ~150-token chats asking for ``--max-tokens`` tokens, streamed. The
rounds alternate the light tenant alone and the light tenant beside the heavy one, with the
same light arrivals in both (one seed per round), so the only difference is the heavy load.
Requests go through the prefill node (``CRESCENT_LOCAL_PREFILL=false``): its queue is where
the tenants' prompts meet.

    .venv/bin/python bench/fairness.py [--light-share 0.15] [--ratio 4] [--seconds 90] \
        [--step-ms MS]

Prints the light tenant's TTFT alone and beside the heavy tenant (p50, p90), the rise of its
p90, what the heavy tenant got (admitted, refused, its TTFT), and where the time to first
token went in each mode (the gateway's mean per phase over all requests of that mode).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.faults import Stack
from bench.overload import Shot, quantiles, shoot, sustainable_rate
from shared import phases as phase_names

KEYS = {"light": "light-tenant-key", "heavy": "heavy-tenant-key"}


@dataclass
class Phase:
    """One round's shots of each tenant, and whether the heavy tenant sent any."""

    together: bool
    shots: dict[str, list[Shot]] = field(default_factory=dict)
    #: phase -> (seconds, requests) the gateway observed during the round
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)


def arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival times in [0, seconds) at ``rate`` per second."""
    rng, t = random.Random(seed), 0.0
    times: list[float] = []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return times
        times.append(t)


async def send(
    http: httpx.AsyncClient, model: str, times: list[float], max_tokens: int
) -> list[Shot]:
    start, tasks = time.monotonic(), []
    for at in times:
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        tasks.append(asyncio.create_task(shoot(http, model, max_tokens)))
    return list(await asyncio.gather(*tasks))


def client(stack: Stack, tenant: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    return httpx.AsyncClient(base_url=stack.base_url[: -len("/v1")], headers=headers, timeout=300)


async def measure(stack: Stack, args: argparse.Namespace) -> tuple[float, list[Phase]]:
    async with client(stack, "light") as light, client(stack, "heavy") as heavy:
        model = (await light.get("/v1/models")).json()["data"][0]["id"]
        await sustainable_rate(light, model, argparse.Namespace(**{**vars(args), "seconds": 4}))
        rate = await sustainable_rate(light, model, args)
        light_rate = args.light_share * rate
        phases: list[Phase] = []
        for n in range(args.rounds):
            light_times = arrivals(light_rate, args.seconds, seed=n)
            for together in (False, True):
                phase = Phase(together)
                sends = {"light": send(light, model, light_times, args.max_tokens)}
                if together:
                    heavy_times = arrivals(args.ratio * light_rate, args.seconds, seed=1000 + n)
                    sends["heavy"] = send(heavy, model, heavy_times, args.max_tokens)
                before = await phase_totals(light)
                results = await asyncio.gather(*sends.values())
                phase.shots = dict(zip(sends, results, strict=True))
                after = await phase_totals(light)
                phase.phases = {
                    name: (total - before.get(name, (0.0, 0.0))[0], n - before.get(name, (0, 0))[1])
                    for name, (total, n) in after.items()
                }
                phases.append(phase)
                await asyncio.sleep(args.settle_s)
    return rate, phases


async def phase_totals(http: httpx.AsyncClient) -> dict[str, tuple[float, float]]:
    """Phase -> (sum of seconds, count) of the gateway's per-phase histogram."""
    text = (await http.get("/metrics")).text
    totals: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "crescent_gateway_request_phase_seconds":
            continue
        for sample in family.samples:
            index = {"_sum": 0, "_count": 1}.get(sample.name.removeprefix(family.name))
            if index is not None:
                totals.setdefault(sample.labels["phase"], [0.0, 0.0])[index] = sample.value
    return {name: (total, n) for name, (total, n) in totals.items()}


def phase_means(phases: list[Phase], together: bool) -> str:
    sums: dict[str, list[float]] = {}
    for p in phases:
        if p.together != together:
            continue
        for name, (total, n) in p.phases.items():
            acc = sums.setdefault(name, [0.0, 0.0])
            acc[0], acc[1] = acc[0] + total, acc[1] + n
    names = (*phase_names.FIRST_TOKEN_PHASES, phase_names.HOPS)
    return ", ".join(
        f"{name} {sums[name][0] / sums[name][1] * 1000:.0f}"
        for name in names
        if name in sums and sums[name][1]
    )


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] if ordered else float("nan")


def ttfts(phases: list[Phase], tenant: str, together: bool) -> list[float]:
    return [
        s.ttft_s
        for p in phases
        if p.together == together
        for s in p.shots.get(tenant, [])
        if s.status == 200 and s.ttft_s is not None
    ]


def render(rate: float, phases: list[Phase], args: argparse.Namespace) -> str:
    light_rate = args.light_share * rate
    alone, beside = ttfts(phases, "light", False), ttfts(phases, "light", True)
    heavy = [s for p in phases for s in p.shots.get("heavy", [])]
    light_all = [s for p in phases for s in p.shots["light"]]
    failed = [s for s in light_all if s.status != 200 or s.ttft_s is None]
    rise = p90(beside) / p90(alone) - 1
    return "\n".join([
        f"sustainable rate {rate:.2f} req/s; light tenant {light_rate:.2f} req/s, heavy tenant "
        f"{args.ratio * light_rate:.2f} req/s ({args.rounds} rounds of {args.seconds:.0f} s each)",
        f"light tenant alone:        TTFT {quantiles(alone)}; p90 {p90(alone) * 1000:.0f} ms "
        f"({len(alone)} requests)",
        f"light beside the heavy one: TTFT {quantiles(beside)}; p90 {p90(beside) * 1000:.0f} ms "
        f"({len(beside)} requests)",
        f"light tenant's p90 TTFT rise: {rise:+.1%}; its requests not served: {len(failed)}",
        f"heavy tenant: admitted {sum(s.status == 200 for s in heavy)}, refused with 429 "
        f"{sum(s.status == 429 for s in heavy)}, TTFT "
        f"{quantiles([s.ttft_s for s in heavy if s.status == 200 and s.ttft_s is not None])}",
        f"first-token phases, mean ms, alone: {phase_means(phases, False)}",
        f"first-token phases, mean ms, beside: {phase_means(phases, True)}",
    ])  # fmt: skip


def stack_env(cache_dir: Path, step_ms: float | None) -> dict[str, str]:
    env = {} if step_ms is None else {"CRESCENT_TENANT_STEP_MS": str(step_ms)}
    return env | {
        "CRESCENT_CACHE_DIR": str(cache_dir),
        "CRESCENT_API_KEYS": ",".join(f"{key}:{tenant}" for tenant, key in KEYS.items()),
        "CRESCENT_HEARTBEAT_INTERVAL_S": "0.5",
        "CRESCENT_LOCAL_PREFILL": "false",
        "UCX_WARN_UNUSED_ENV_VARS": "n",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--light-share", type=float, default=0.15)
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="the questions' random tags")
    parser.add_argument(
        "--step-ms", type=float, default=None, help="CRESCENT_TENANT_STEP_MS (default: its own)"
    )
    args = parser.parse_args()
    random.seed(args.seed)
    cache_dir = Path(os.environ.get("CRESCENT_CACHE_DIR", Path.home() / ".cache" / "crescent"))
    with tempfile.TemporaryDirectory(prefix="crescent-fairness-") as tmp:
        stack = Stack.start(Path(tmp), stack_env(cache_dir, args.step_ms), ())
        try:
            rate, phases = asyncio.run(measure(stack, args))
        finally:
            stack.stop()
    print(render(rate, phases, args))


if __name__ == "__main__":
    main()
