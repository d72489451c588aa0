"""What TLS on the internal links costs a whole stack: the same greedy streams through `crescent
up` (one prefill and one decode node, every request handed off, KV pulled over TCP) with the
links in clear and with mutual TLS, one stack after the other in one run.

    .venv/bin/python bench/tls_itl.py --requests 8 --concurrency 2
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos import stack_env
from bench.faults import Stack
from crescent.certs import write_cert
from shared.model.files import default_cache_dir

PROMPT = "Write a long story about a lighthouse keeper and the sea, in plain words. Part {i}."


async def one(client: AsyncOpenAI, model: str, i: int, max_tokens: int) -> tuple[float, float]:
    """(time to first token, mean time between tokens) of one streamed request."""
    started = time.monotonic()
    arrivals: list[float] = []
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT.format(i=i)}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return arrivals[0] - started, statistics.fmean(gaps)


async def workload(
    stack: Stack, requests: int, concurrency: int, max_tokens: int
) -> list[tuple[float, float]]:
    client = AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=600)
    model = (await client.models.list()).data[0].id
    await one(client, model, -1, 8)  # warm-up
    gate = asyncio.Semaphore(concurrency)

    async def run(i: int) -> tuple[float, float]:
        async with gate:
            return await one(client, model, i, max_tokens)

    results = await asyncio.gather(*(run(i) for i in range(requests)))
    await client.close()
    return list(results)


def measure(tls: bool, args: argparse.Namespace, tmp: Path) -> list[tuple[float, float]]:
    env = stack_env(args.cache_dir, "tcp")
    if tls:
        env |= write_cert(tmp / "tls", "stack").env()
    stack = Stack.start(tmp / ("tls" if tls else "clear"), env)
    conf = (stack.data_dir / "secrets" / "nats.conf").read_text()
    print(f"stack {'with' if tls else 'without'} certificates: NATS tls block {'tls:' in conf}")
    try:
        return asyncio.run(workload(stack, args.requests, args.concurrency, args.max_tokens))
    finally:
        stack.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="crescent-tls-itl-") as tmp:
        runs = {mode: measure(mode == "TLS", args, Path(tmp)) for mode in ("clear", "TLS")}
    print(f"{'':28s} {'clear':>9s} {'TLS':>9s} {'TLS/clear':>10s}")
    for label, index in (("TTFT, median ms", 0), ("time between tokens, median ms", 1)):
        clear, tls = (statistics.median(r[index] for r in runs[m]) * 1e3 for m in runs)
        print(f"{label:28s} {clear:9.1f} {tls:9.1f} {tls / clear:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
