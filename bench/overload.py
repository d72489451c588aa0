"""Overload: three times the rate the stack sustains, against `crescent up` with a TTFT
objective. The excess must be refused early and cheaply (429 with Retry-After, fast), and the
requests let in must meet the objective.

First a closed loop of ``--clients`` streaming clients measures the sustainable rate R
(completed requests per second). Then requests arrive at ``--factor`` x R, evenly spaced, for
``--seconds``; each is a fresh ~150-token chat asking for ``--max-tokens`` tokens, streamed.

    .venv/bin/python bench/overload.py [--slo-ms 2000] [--factor 3] [--seconds 20]

Prints the rates, how many requests were let in and refused, the refusals' latency (to the
HTTP status), the admitted requests' time to first token, p50/p99/max, and the goodput under
the offered load (admitted within the objective per second) against the sustainable rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.faults import Stack


@dataclass
class Shot:
    """One request: its HTTP status, when the status came, and its first token."""

    status: int = 0
    status_s: float = 0.0
    ttft_s: float | None = None
    retry_after: str | None = None
    error: str = ""


@dataclass
class Report:
    """``refusals_by_bucket``: the gateway's own count of 429s by how soon their status line
    went out (its ``crescent_gateway_response_start_seconds`` histogram, upper bound in
    seconds -> count, over the offered load only)."""

    rate: float
    offered: float
    seconds: float
    shots: list[Shot] = field(default_factory=list)
    refusals_by_bucket: dict[float, float] = field(default_factory=dict)

    def of(self, status: int) -> list[Shot]:
        return [s for s in self.shots if s.status == status]


def question() -> str:
    tag = random.randrange(10**9)
    facts = " ".join(f"Item {i} costs {i * 3} coins." for i in range(12))
    return f"[{tag}] {facts} Which item costs 18 coins?"


async def shoot(http: httpx.AsyncClient, model: str, max_tokens: int) -> Shot:
    shot, started = Shot(), time.monotonic()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question()}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            shot.status, shot.status_s = response.status_code, time.monotonic() - started
            shot.retry_after = response.headers.get("retry-after")
            async for line in response.aiter_lines():
                if shot.ttft_s is None and '"content":"' in line:
                    shot.ttft_s = time.monotonic() - started
    except Exception as exc:
        shot.error = f"{type(exc).__name__}: {exc}"
    return shot


async def sustainable_rate(http: httpx.AsyncClient, model: str, args: argparse.Namespace) -> float:
    """Completed requests per second with ``args.clients`` clients back to back, over
    ``args.seconds``, or longer (up to four times) until each client completed one: a host
    busy with other work may finish none in the window, and a rate of 0 measures nothing."""
    done = 0
    started = time.monotonic()
    stop, last = started + args.seconds, started + 4 * args.seconds

    def going() -> bool:
        now = time.monotonic()
        return now < stop or (done < args.clients and now < last)

    async def client() -> None:
        nonlocal done
        while going():
            shot = await shoot(http, model, args.max_tokens)
            done += shot.status == 200
            if shot.status == 429:  # a well-behaved client waits as told
                await asyncio.sleep(float(shot.retry_after or 1))

    await asyncio.gather(*(client() for _ in range(args.clients)))
    if done == 0:
        raise RuntimeError(f"no request completed in {4 * args.seconds:.0f} s: no rate to measure")
    return done / (time.monotonic() - started)


async def offered_load(http: httpx.AsyncClient, model: str, rate: float, seconds: float,
                       max_tokens: int) -> list[Shot]:  # fmt: skip
    tasks, gap = [], 1.0 / rate
    start = time.monotonic()
    # At least three: on a host too slow for one request in ``seconds`` there is still an
    # excess to refuse.
    for i in range(max(int(rate * seconds), 3)):
        await asyncio.sleep(max(0.0, start + i * gap - time.monotonic()))
        tasks.append(asyncio.create_task(shoot(http, model, max_tokens)))
    return list(await asyncio.gather(*tasks))


def quantiles(values: list[float]) -> str:
    if not values:
        return "-"
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    return f"p50 {statistics.median(ms):.0f} ms, p99 {p99:.0f} ms, max {ms[-1]:.0f} ms"


async def measure(stack: Stack, args: argparse.Namespace) -> Report:
    async with httpx.AsyncClient(base_url=stack.base_url[: -len("/v1")], timeout=120) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        await sustainable_rate(http, model, argparse.Namespace(**{**vars(args), "seconds": 4}))
        rate = await sustainable_rate(http, model, args)
        offered = args.factor * rate
        before = await refusal_buckets(http)
        shots = await offered_load(http, model, offered, args.seconds, args.max_tokens)
        after = await refusal_buckets(http)
    buckets = {le: after[le] - before.get(le, 0.0) for le in after}
    return Report(rate, offered, args.seconds, shots, buckets)


async def refusal_buckets(http: httpx.AsyncClient) -> dict[float, float]:
    """The cumulative buckets of the gateway's 429 response-start histogram."""
    text = (await http.get("/metrics")).text
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith("crescent_gateway_response_start_seconds_bucket{") and (
            'status="429"' in line
        ):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def share_within(buckets: dict[float, float], limit_s: float) -> str:
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return "-"
    return f"{buckets.get(limit_s, 0.0) / total:.1%} of {total:.0f}"


def render(report: Report, slo_ms: float) -> str:
    ok, refused = report.of(200), report.of(429)
    other = [s for s in report.shots if s.status not in (200, 429)]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    within = sum(t * 1000 <= slo_ms for t in ttfts)
    lines = [
        f"sustainable rate {report.rate:.2f} req/s; offered {report.offered:.2f} req/s "
        f"({len(report.shots)} requests)",
        f"admitted {len(ok)}, refused with 429 {len(refused)}, other {len(other)}"
        + (f" ({other[0].status} {other[0].error})" if other else ""),
        f"429 latency at the client: {quantiles([s.status_s for s in refused])}; "
        f"with Retry-After: {sum(s.retry_after is not None for s in refused)}",
        f"429s the gateway sent within 50 ms of arrival: "
        f"{share_within(report.refusals_by_bucket, 0.05)}",
        f"admitted TTFT: {quantiles(ttfts)}; within the {slo_ms:.0f} ms objective: "
        f"{within} of {len(ttfts)}",
        # DistServe's goodput: requests served within the objective per second. The closed
        # loop's rate is the peak (its requests wait for nobody but each other).
        f"goodput under the offered load {within / report.seconds:.2f} req/s, "
        f"{within / report.seconds / report.rate:.0%} of the sustainable rate; worst admitted "
        f"TTFT {max(ttfts, default=0.0) * 1000 / slo_ms:.2f}× the objective",
    ]
    return "\n".join(lines)


def stack_env(cache_dir: Path, slo_ms: float) -> dict[str, str]:
    return {
        "CRESCENT_CACHE_DIR": str(cache_dir),
        "CRESCENT_TTFT_SLO_MS": str(slo_ms),
        "CRESCENT_HEARTBEAT_INTERVAL_S": "0.5",
        # The sustainable rate is measured on the prefill node's queue alone.
        "CRESCENT_LOCAL_PREFILL": "false",
        "UCX_WARN_UNUSED_ENV_VARS": "n",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slo-ms", type=float, default=2000.0)
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=16)

    args = parser.parse_args()
    cache_dir = Path(os.environ.get("CRESCENT_CACHE_DIR", Path.home() / ".cache" / "crescent"))
    with tempfile.TemporaryDirectory(prefix="crescent-overload-") as tmp:
        stack = Stack.start(Path(tmp), stack_env(cache_dir, args.slo_ms), ())
        try:
            report = asyncio.run(measure(stack, args))
        finally:
            stack.stop()
    print(render(report, args.slo_ms))


if __name__ == "__main__":
    main()
