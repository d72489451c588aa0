"""One request at a time through `crescent up`: where each millisecond of it goes.

For each configuration (environment assignments given to the whole stack), starts a stack,
warms it up, then sends requests one after the other, each a fresh prompt of random token ids
streamed through `/v1/completions` (greedy, `ignore_eos`), then one longer prompt, and that
prompt again `--hits` times (full prefix hits, whose output must equal the cold run's). The
client measures the time to first token and the gaps between tokens; the gateway's debug view
(`GET /debug/requests/{id}`) gives each request's phases and nodes. First, the same requests
run on the engine alone (in a process of its own, no services), the reference the served
figures are divided by. Prints the median of every figure per configuration, side by side,
and writes them as JSON with `--out`.

    .venv/bin/python bench/served.py [--requests 8] [--prompt-tokens 512] [--max-tokens 64]
        [--hit-tokens 1359] [--hits 3] [--config NAME=VAR=VALUE,VAR=VALUE ...] [--out FILE]
        [--no-engine-alone]

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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Shape:
    """The requests of a run: ``requests`` fresh prompts of ``prompt_tokens``, each making
    ``max_tokens``; then one of ``hit_tokens`` and ``hits`` repeats of it."""

    requests: int
    prompt_tokens: int
    max_tokens: int
    seed: int
    hit_tokens: int
    hits: int


async def one_request(
    http: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int
) -> dict[str, Any]:
    """One streamed completion (``crescent bench``'s client), then its phases and nodes from
    the gateway's debug view."""
    request = BenchRequest(0, 0, 0, 0.0, tuple(prompt), max_tokens)
    record = RequestRecord(0, 0, 0, 0.0, 0.0, len(prompt), max_tokens)
    body = request_body(request, model, ignore_eos=True, cache_salt=None)
    text: list[str] = []
    await stream_completion(http, "/v1/completions", body, record, on_text=text.append)
    if not record.ok or record.ttft_s is None or not record.itl_s:
        raise RuntimeError(f"a request failed: {record.error or 'too few tokens'}")
    view = (await http.get(f"/debug/requests/{record.response_id}")).json()
    return {
        "id": record.response_id,
        "ttft_s": record.ttft_s,
        "itl_s": statistics.mean(record.itl_s),
        "phases_s": view["phases_s"],
        "placed": view.get("placed", {}),
        "text": "".join(text),
    }


def engine_alone(shape: Shape) -> dict[str, Any]:
    """The same requests on the engine alone, in this process, no services: each fresh
    prompt's prefill, the median decode step, and the long prompt's first step when it is a
    full hit."""
    from shared.config import EngineSettings
    from shared.engine.factory import load_engine
    from shared.sampling_params import SamplingParams

    engine = load_engine(EngineSettings()).engine
    rng = random.Random(shape.seed)
    params = SamplingParams(max_tokens=shape.max_tokens, temperature=0.0, ignore_eos=True)

    def timed_steps(request_id: str, prompt: list[int]) -> list[float]:
        engine.add_request(request_id, prompt, params)
        steps = []
        while engine.has_unfinished_requests():
            started = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - started)
        return steps

    prefills, decode_steps = [], []
    for i in range(shape.requests + 2):
        steps = timed_steps(f"r{i}", fresh_prompt(rng, shape.prompt_tokens))
        if i >= 2:  # the same two warm-up requests as the stack gets
            prefills.append(steps[0])
            decode_steps.extend(steps[1:])
    long = fresh_prompt(rng, shape.hit_tokens)
    timed_steps("long", long)
    hits = [timed_steps(f"hit{i}", long)[0] for i in range(shape.hits)]
    return {
        "prefill_s": statistics.median(prefills),
        "decode_step_s": statistics.median(decode_steps),
        "hit_prefill_s": statistics.median(hits),
    }


def fresh_prompt(rng: random.Random, tokens: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(tokens)]


def run_config(env: dict[str, str], shape: Shape) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="crescent-served-") as data_dir:
        stack = Stack.start(Path(data_dir), env)
        try:
            return asyncio.run(_requests(stack, shape))
        finally:
            stack.stop()


async def _requests(stack: Stack, shape: Shape) -> dict[str, Any]:
    rng = random.Random(shape.seed)
    gateway = stack.base_url.removesuffix("/v1")
    async with httpx.AsyncClient(base_url=gateway, timeout=300) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        for _ in range(2):  # warm-up: first touches of the pool, the kernels, the bus
            await one_request(http, model, fresh_prompt(rng, shape.prompt_tokens), 8)
        cold = [
            await one_request(http, model, fresh_prompt(rng, shape.prompt_tokens), shape.max_tokens)
            for _ in range(shape.requests)
        ]
        long = fresh_prompt(rng, shape.hit_tokens)
        first = await one_request(http, model, long, shape.max_tokens)
        hits = [await one_request(http, model, long, shape.max_tokens) for _ in range(shape.hits)]
    return {"cold": cold, "long": first, "hits": hits}


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
    hit_ttfts = [statistics.median(h["ttft_s"] for h in r["hits"]) for r in results.values()]
    table.add_row("full hit: ttft_s", *(f"{t * 1000:.1f}" for t in hit_ttfts))
    Console(width=100).print(table)
    for name, result in results.items():
        same = all(h["text"] == result["long"]["text"] for h in result["hits"])
        nodes = {h["placed"].get("prefill_node", "?") for h in result["hits"]}
        print(f"{name}: full hits {'give' if same else 'do NOT give'} the cold run's output;"
              f" prefilled on {', '.join(sorted(nodes))}")  # fmt: skip
        if alone is not None:
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
    parser.add_argument("--hit-tokens", type=int, default=1359, help="the prompt asked again")
    parser.add_argument("--hits", type=int, default=3, help="times it is asked again")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=parse_config, action="append", default=[])
    parser.add_argument("--out", type=Path, default=None, help="JSON of every request")
    parser.add_argument(
        "--no-engine-alone", action="store_true", help="skip the engine-only reference run"
    )
    args = parser.parse_args()
    shape = Shape(
        args.requests, args.prompt_tokens, args.max_tokens, args.seed, args.hit_tokens, args.hits
    )
    configs = dict(args.config) or {"default": {}}
    alone = None if args.no_engine_alone else _in_child(shape)
    results = {name: run_config(env, shape) for name, env in configs.items()}
    report(results, alone)
    if args.out is not None:
        args.out.write_text(json.dumps({"engine_alone": alone, "stacks": results}, indent=1))
    return 0


def _in_child(shape: Shape) -> dict[str, Any]:
    """``engine_alone`` in a process of its own: its model and pool are gone before any
    stack starts."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result: dict[str, Any] = pool.apply(engine_alone, (shape,))
    return result


if __name__ == "__main__":
    raise SystemExit(main())
