"""One request at a time through `crescent up`: where each millisecond of it goes.

For each configuration (environment assignments given to the whole stack), starts a stack,
warms it up, then sends requests one after the other, each a fresh prompt of random token ids
streamed through `/v1/completions` (greedy, `ignore_eos`), and the last prompt once more (a full
prefix hit). The client measures the time to first token and the gaps between tokens; the
gateway's debug view (`GET /debug/requests/{id}`) gives each request's phases. First, the
same requests run on the engine alone (in a process of its own, no services), the reference
the served figures are divided by. Prints the median of every figure per configuration, side
by side, and writes them as JSON with `--out`.

    .venv/bin/python bench/served.py [--requests 8] [--prompt-tokens 512] [--max-tokens 64]
        [--config NAME=VAR=VALUE,VAR=VALUE ...] [--out FILE] [--no-engine-alone]

A configuration named `default` with no assignments runs unless `--config` names others.
Run it on a quiet machine: the stack's nodes run below the client's priority.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.faults import Stack
from crescent.bench.client import request_body, stream_completion
from crescent.bench.records import RequestRecord
from crescent.bench.workload import BenchRequest

#: Token ids the prompts are drawn from: ordinary tokens of the default model's vocabulary.
TOKEN_RANGE = (1000, 40000)


def parse_config(text: str) -> tuple[str, dict[str, str]]:
    """``NAME=VAR=VALUE,VAR=VALUE`` (or a bare ``NAME``) as the name and its environment."""
    name, _, rest = text.partition("=")
    env = {}
    for item in filter(None, rest.split(",")):
        var, sep, value = item.partition("=")
        if not sep or not var:
            raise argparse.ArgumentTypeError(f"{item!r} is not VAR=VALUE")
        env[var] = value
    return name, env


async def one_request(
    http: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int
) -> dict[str, Any]:
    """One streamed completion (``crescent bench``'s client), then its phases from the
    gateway's debug view."""
    request = BenchRequest(0, 0, 0, 0.0, tuple(prompt), max_tokens)
    record = RequestRecord(0, 0, 0, 0.0, 0.0, len(prompt), max_tokens)
    body = request_body(request, model, ignore_eos=True, cache_salt=None)
    await stream_completion(http, "/v1/completions", body, record)
    if not record.ok or record.ttft_s is None or not record.itl_s:
        raise RuntimeError(f"a request failed: {record.error or 'too few tokens'}")
    view = (await http.get(f"/debug/requests/{record.response_id}")).json()
    return {
        "id": record.response_id,
        "ttft_s": record.ttft_s,
        "itl_s": statistics.mean(record.itl_s),
        "phases_s": view["phases_s"],
    }


def engine_alone(requests: int, prompt_tokens: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """The same requests on the engine alone, in this process, no services: each fresh
    prompt's prefill, the median decode step, and the last prompt's full hit."""
    from shared.config import EngineSettings
    from shared.engine.factory import load_engine
    from shared.sampling_params import SamplingParams

    engine = load_engine(EngineSettings()).engine
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    def timed_steps(request_id: str, prompt: list[int]) -> list[float]:
        engine.add_request(request_id, prompt, params)
        steps = []
        while engine.has_unfinished_requests():
            started = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - started)
        return steps

    prefills, decode_steps, prompt = [], [], []
    for i in range(requests + 2):
        prompt = [rng.randrange(*TOKEN_RANGE) for _ in range(prompt_tokens)]
        steps = timed_steps(f"r{i}", prompt)
        if i >= 2:  # the same two warm-up requests as the stack gets
            prefills.append(steps[0])
            decode_steps.extend(steps[1:])
    hit = timed_steps("hit", prompt)[0]
    return {
        "prefill_s": statistics.median(prefills),
        "decode_step_s": statistics.median(decode_steps),
        "hit_prefill_s": hit,
    }


def run_config(
    env: dict[str, str], requests: int, prompt_tokens: int, max_tokens: int, seed: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="crescent-served-") as data_dir:
        stack = Stack.start(Path(data_dir), env)
        try:
            return asyncio.run(_requests(stack, requests, prompt_tokens, max_tokens, seed))
        finally:
            stack.stop()


async def _requests(
    stack: Stack, requests: int, prompt_tokens: int, max_tokens: int, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)

    def fresh() -> list[int]:
        return [rng.randrange(*TOKEN_RANGE) for _ in range(prompt_tokens)]

    gateway = stack.base_url.removesuffix("/v1")
    async with httpx.AsyncClient(base_url=gateway, timeout=300) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        for _ in range(2):  # warm-up: first touches of the pool, the kernels, the bus
            await one_request(http, model, fresh(), max_tokens)
        cold, prompt = [], fresh()
        for _ in range(requests):
            prompt = fresh()
            cold.append(await one_request(http, model, prompt, max_tokens))
        hit = await one_request(http, model, prompt, max_tokens)
    return {"cold": cold, "hit": hit}


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    out = {k: statistics.median(r[k] for r in runs) for k in ("ttft_s", "itl_s")}
    phases = sorted({p for r in runs for p in r["phases_s"]})
    for phase in phases:
        out[phase] = statistics.median(r["phases_s"].get(phase, 0.0) for r in runs)
    return out


def report(results: dict[str, dict[str, Any]], alone: dict[str, float] | None) -> None:
    if alone is not None:
        Console(width=100).print(
            "engine alone (same requests, no services): prefill "
            f"{alone['prefill_s'] * 1000:.1f} ms, decode step {alone['decode_step_s'] * 1000:.1f}"
            f" ms, full hit {alone['hit_prefill_s'] * 1000:.1f} ms"
        )
    table = Table(title="one request at a time (medians, ms)")
    table.add_column("figure")
    summary = {name: medians(r["cold"]) for name, r in results.items()}
    for name in results:
        table.add_column(name, justify="right")
    rows = sorted({k for s in summary.values() for k in s}, key=_row_order)
    for row in rows:
        table.add_row(row, *(f"{s.get(row, float('nan')) * 1000:.1f}" for s in summary.values()))
    table.add_row(
        "full hit: ttft_s", *(f"{r['hit']['ttft_s'] * 1000:.1f}" for r in results.values())
    )
    Console(width=100).print(table)
    if alone is not None:
        for name, result in results.items():
            cold = medians(result["cold"])
            print(
                f"{name}: ITL / engine step {cold['itl_s'] / alone['decode_step_s']:.2f}x, "
                f"TTFT / (engine prefill + 15 ms) "
                f"{cold['ttft_s'] / (alone['prefill_s'] + 0.015):.2f}x"
            )


def _row_order(name: str) -> tuple[int, str]:
    first = ("ttft_s", "itl_s")
    return (first.index(name), name) if name in first else (2, name)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=parse_config, action="append", default=[])
    parser.add_argument("--out", type=Path, default=None, help="JSON of every request")
    parser.add_argument(
        "--no-engine-alone", action="store_true", help="skip the engine-only reference run"
    )
    args = parser.parse_args()
    configs = dict(args.config) or {"default": {}}
    alone = None
    if not args.no_engine_alone:
        alone = _in_child(args.requests, args.prompt_tokens, args.max_tokens, args.seed)
    results = {
        name: run_config(env, args.requests, args.prompt_tokens, args.max_tokens, args.seed)
        for name, env in configs.items()
    }
    report(results, alone)
    if args.out is not None:
        args.out.write_text(json.dumps({"engine_alone": alone, "stacks": results}, indent=1))
    return 0


def _in_child(requests: int, prompt_tokens: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """``engine_alone`` in a process of its own: its model and pool are gone before any
    stack starts."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result: dict[str, Any] = pool.apply(
            engine_alone, (requests, prompt_tokens, max_tokens, seed)
        )
    return result


if __name__ == "__main__":
    raise SystemExit(main())
