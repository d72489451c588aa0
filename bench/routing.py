"""Cache-aware placement against round-robin, side by side, on a multi-turn workload.

For each placement (``CRESCENT_PLACEMENT``: ``round_robin``, the cache-oblivious baseline that
hands prefill nodes requests in turn and plans no pulls, then ``cost``, the cache-aware cost
model) this starts a fresh ``crescent up`` (new data dir, new NATS and cachemeta: every cache
starts cold), replays the same workload against it and stops it. The workload is the first
``--requests`` requests of a slice of the Mooncake conversation trace (``bench/data``, see
``bench/workloads.py``), grouped into conversations. Prompts are token-id lists that share
exact prefixes where the trace's hash ids do, sent to ``/v1/completions`` with ``stream=True``
at the trace's arrival times divided by ``--speedup`` (or as fast as ``--concurrency``
requests in flight allow, with ``--speedup 0``); a turn is never sent before its
conversation's previous turn has finished, and TTFT counts from when it is sent.

Per run: time to first token (request sent → first chunk with a choice, client side), the
cached-token ratio (sum of ``usage.prompt_tokens_details.cached_tokens`` over the sum of
``prompt_tokens``) and throughput. Any failed request stops the bench with exit status 1.

    .venv/bin/python bench/routing.py [--prefill 2] [--requests 100] [--speedup 10]
        [--concurrency 0] [--transfer tcp] [--json results.json]
    .venv/bin/python bench/routing.py --requests 20          # a quick smoke run

The model is the stack's default, converted under ``$CRESCENT_CACHE_DIR`` on the first start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from workloads import (  # bench/ is this script's directory, so first on sys.path
    DEFAULT_SLICE,
    Conversation,
    Turn,
    all_turns,
    build_workload,
    load_trace,
    reusable_tokens,
)

PLACEMENTS = ("round_robin", "cost")
READY_LINE = "Crescent is serving"
START_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0
# A stack of its own for each run: nothing may point it at a shared NATS, catalogue or key set.
CLEARED_ENV = (
    "CRESCENT_NATS_URL",
    "CRESCENT_CACHEMETA_URL",
    "CRESCENT_DB_URL",
    "CRESCENT_API_KEYS",
)


NO_NODE_HINT = (
    "hint: the scheduler found no prefill node alive: their heartbeats came later than "
    "CRESCENT_HEARTBEAT_TIMEOUT_S (3 s by default) while they computed; this bench passes that "
    "variable through to the stack"
)


class BenchError(Exception):
    """A failed request or stack: the bench stops and exits with status 1."""


@dataclass(frozen=True)
class Options:
    prefill: int
    decode: int
    requests: int
    speedup: float
    concurrency: int
    transfer: str
    kv_cache_mb: int
    max_batched_tokens: int | None
    tokens_per_block: int
    block_size: int
    max_tokens: int
    trace: Path
    placements: tuple[str, ...]
    json_path: Path | None
    keep_data: bool


@dataclass(frozen=True)
class Result:
    """One finished request, times in seconds from the run's start."""

    conversation: int
    turn: int
    sent_s: float
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass
class Run:
    placement: str
    results: list[Result] = field(default_factory=list)


# ---------------------------------------------------------------------------- the stack


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stack_env(opts: Options, placement: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env.setdefault("CRESCENT_HEARTBEAT_INTERVAL_S", "0.5")
    if opts.max_batched_tokens is not None:
        env["CRESCENT_MAX_NUM_BATCHED_TOKENS"] = str(opts.max_batched_tokens)
    return env | {
        "CRESCENT_PLACEMENT": placement,
        "CRESCENT_TRANSFER": opts.transfer,
        "CRESCENT_KV_CACHE_MB": str(opts.kv_cache_mb),
        "CRESCENT_BLOCK_SIZE": str(opts.block_size),
        "UCX_NET_DEVICES": env.get("UCX_NET_DEVICES", "lo"),
        "UCX_WARN_UNUSED_ENV_VARS": "n",
    }


@dataclass
class Stack:
    """One ``crescent up`` as a child process, serving on ``port``."""

    proc: subprocess.Popen[str]
    port: int
    data_dir: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @classmethod
    def start(cls, opts: Options, placement: str, data_dir: Path) -> Stack:
        port = free_port()
        argv = [sys.executable, "-m", "crescent", "up", "--port", str(port)]
        argv += ["--prefill", str(opts.prefill), "--decode", str(opts.decode)]
        argv += ["--data-dir", str(data_dir)]
        proc = subprocess.Popen(
            argv,
            env=stack_env(opts, placement),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        stack = cls(proc, port, data_dir)
        stack._wait_ready()
        return stack

    def _wait_ready(self) -> None:
        # `crescent up` gives up by itself when a service dies or never reports ready.
        assert self.proc.stdout is not None
        output: list[str] = []
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            output.append(line)
            if line.startswith(READY_LINE):
                return
        self.stop()
        raise BenchError(f"crescent up did not become ready:\n{''.join(output)}\n{self.logs()}")

    def stop(self, timeout_s: float = 90) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def logs(self, chars: int = 2500) -> str:
        parts = []
        for log in sorted((self.data_dir / "logs").glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)


# ---------------------------------------------------------------------------- the client


def request_body(model: str, prompt: Sequence[int], max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_once(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[float, float, dict[str, Any]]:
    """Sends one streaming completion; returns (TTFT, latency, usage) in seconds."""
    start = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] | None = None
    done = False
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            raise BenchError(f"HTTP {resp.status_code}: {text[:500]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                raise BenchError(f"error event: {event['error']}")
            if event.get("choices") and first is None:
                first = time.perf_counter() - start
            usage = event.get("usage") or usage
    if first is None or usage is None or not done:
        raise BenchError(f"incomplete stream (first chunk: {first}, usage: {usage}, done: {done})")
    return first, time.perf_counter() - start, usage


async def play_conversation(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    turns: Conversation,
    clock: Clock,
    on_done: Callable[[], None],
) -> list[Result]:
    results = []
    for turn in turns:
        await clock.wait_until(turn.arrival_s)
        async with clock.slots:
            sent = clock.now()
            ttft, latency, usage = await _send(client, url, model, turn)
        results.append(result_of(turn, sent, ttft, latency, usage))
        on_done()
    return results


def result_of(
    turn: Turn, sent: float, ttft: float, latency: float, usage: dict[str, Any]
) -> Result:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    prompt, completion = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
    if prompt != len(turn.prompt) or completion < 1:
        raise BenchError(f"conversation {turn.conversation} turn {turn.index}: usage {usage}")
    return Result(
        turn.conversation, turn.index, sent, ttft, latency, prompt, int(cached), completion
    )


async def _send(
    client: httpx.AsyncClient, url: str, model: str, turn: Turn
) -> tuple[float, float, dict[str, Any]]:
    try:
        return await stream_once(client, url, request_body(model, turn.prompt, turn.max_tokens))
    except (BenchError, httpx.HTTPError, ValueError) as exc:
        where = f"conversation {turn.conversation} turn {turn.index}"
        raise BenchError(f"{where} ({len(turn.prompt)} prompt tokens) failed: {exc!r}") from exc


class Clock:
    """The run's time base: trace arrival times divided by the speed-up (0: no waiting), and
    the cap on requests in flight (0: none)."""

    def __init__(self, speedup: float, concurrency: int) -> None:
        self.start = time.perf_counter()
        self.speedup = speedup
        self.slots = asyncio.Semaphore(concurrency if concurrency > 0 else 1 << 30)

    def now(self) -> float:
        return time.perf_counter() - self.start

    async def wait_until(self, arrival_s: float) -> None:
        if self.speedup > 0:
            await asyncio.sleep(max(0.0, arrival_s / self.speedup - self.now()))


async def play(base_url: str, conversations: list[Conversation], opts: Options) -> list[Result]:
    url = f"{base_url}/completions"
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        model = (await client.get(f"{base_url}/models")).json()["data"][0]["id"]
        await warm_up(client, url, model, opts.prefill)
        with Progress(transient=True) as progress:
            task = progress.add_task("requests", total=sum(len(c) for c in conversations))

            def advance() -> None:
                progress.advance(task)

            clock = Clock(opts.speedup, opts.concurrency)
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(play_conversation(client, url, model, c, clock, advance))
                    for c in conversations
                ]
    return sorted((r for t in tasks for r in t.result()), key=lambda r: r.sent_s)


async def warm_up(client: httpx.AsyncClient, url: str, model: str, nodes: int) -> None:
    """Concurrent requests, one per prefill node, on prompts the workload never uses (ids
    below its range), so every node has run the model once before the clock starts."""
    bodies = [request_body(model, [60 + n] * 48, 2) for n in range(max(2, nodes))]
    await asyncio.gather(*(stream_once(client, url, b) for b in bodies))


def run_placement(placement: str, conversations: list[Conversation], opts: Options) -> Run:
    data_dir = Path(tempfile.mkdtemp(prefix=f"crescent-routing-{placement}-"))
    stack = Stack.start(opts, placement, data_dir)
    run = Run(placement)
    try:
        run.results = play_sync(stack.base_url, conversations, opts)
    except BenchError as exc:
        raise BenchError(f"{placement}: {exc}\nlogs in {data_dir}\n{stack.logs()}") from None
    finally:
        status = stack.stop()
    if status != 0:
        raise BenchError(f"{placement}: crescent up exited with {status}\n{stack.logs()}")
    if not opts.keep_data:
        shutil.rmtree(data_dir, ignore_errors=True)
    return run


def play_sync(base_url: str, conversations: list[Conversation], opts: Options) -> list[Result]:
    """Runs :func:`play`; the failures of a task group become one BenchError."""
    try:
        return asyncio.run(play(base_url, conversations, opts))
    except ExceptionGroup as group:
        failures = flatten(group)
        if not all(isinstance(e, BenchError) for e in failures):
            raise
        raise BenchError("\n".join(str(e) for e in failures)) from None


def flatten(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(flatten(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


# ---------------------------------------------------------------------------- the report


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize(run: Run) -> dict[str, float]:
    ttft = [r.ttft_s for r in run.results]
    later = [r.ttft_s for r in run.results if r.turn > 0]
    prompt = sum(r.prompt_tokens for r in run.results)
    span = max(r.sent_s + r.latency_s for r in run.results)
    return {
        "requests": len(run.results),
        "ttft_mean_s": mean(ttft),
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p90_s": percentile(ttft, 0.9),
        "ttft_p99_s": percentile(ttft, 0.99),
        "ttft_later_turns_mean_s": mean(later),
        "latency_mean_s": mean([r.latency_s for r in run.results]),
        "prompt_tokens": prompt,
        "cached_tokens": sum(r.cached_tokens for r in run.results),
        "cached_ratio": sum(r.cached_tokens for r in run.results) / prompt,
        "throughput_rps": len(run.results) / span,
        "prompt_tok_per_s": prompt / span,
        "makespan_s": span,
    }


ROWS = (  # key, label, format
    ("requests", "requests", "{:.0f}"),
    ("ttft_mean_s", "TTFT mean (s)", "{:.3f}"),
    ("ttft_p50_s", "TTFT p50 (s)", "{:.3f}"),
    ("ttft_p90_s", "TTFT p90 (s)", "{:.3f}"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.3f}"),
    ("ttft_later_turns_mean_s", "TTFT mean, turns ≥ 2 (s)", "{:.3f}"),
    ("latency_mean_s", "request latency mean (s)", "{:.3f}"),
    ("cached_ratio", "cached-token ratio", "{:.1%}"),
    ("cached_tokens", "cached / prompt tokens", ""),
    ("throughput_rps", "throughput (req/s)", "{:.2f}"),
    ("prompt_tok_per_s", "throughput (prompt tok/s)", "{:.0f}"),
    ("makespan_s", "makespan (s)", "{:.1f}"),
)


def cell(summary: dict[str, float], key: str, fmt: str) -> str:
    if key == "cached_tokens":
        return f"{summary['cached_tokens']:.0f} / {summary['prompt_tokens']:.0f}"
    return fmt.format(summary[key])


def results_table(summaries: dict[str, dict[str, float]], title: str) -> Table:
    table = Table(title=title)
    table.add_column("measure")
    for placement in summaries:
        table.add_column(placement, justify="right")
    compare = {"round_robin", "cost"} <= summaries.keys()
    if compare:
        table.add_column("cost / round_robin", justify="right")
    for key, label, fmt in ROWS:
        row = [label, *(cell(s, key, fmt) for s in summaries.values())]
        if compare:
            base = summaries["round_robin"][key]
            row.append(
                f"{summaries['cost'][key] / base:.2f}×" if key != "requests" and base else ""
            )
        table.add_row(*row)
    return table


def workload_line(conversations: list[Conversation], opts: Options) -> str:
    turns = all_turns(conversations)
    prompt = sum(len(t.prompt) for t in turns)
    ideal = reusable_tokens(conversations, opts.block_size) / prompt
    if opts.speedup > 0:
        last = turns[-1].arrival_s / opts.speedup
        pace = f"at trace times / {opts.speedup:g} (last at {last:.0f} s)"
    else:
        pace = "without pacing"
    cap = f", at most {opts.concurrency} in flight" if opts.concurrency > 0 else ""
    return (
        f"{len(turns)} requests in {len(conversations)} conversations from {opts.trace.name}, "
        f"{prompt} prompt tokens (mean {prompt / len(turns):.0f}; "
        f"{opts.tokens_per_block} per 512-token trace block), max_tokens ≤ {opts.max_tokens}, "
        f"sent {pace}{cap}; one unbounded prefix cache would serve {ideal:.1%} of prompt tokens"
    )


def placement_setting_missing() -> bool:
    """True when this checkout's scheduler has no ``placement`` setting: it would ignore
    ``CRESCENT_PLACEMENT`` and every run would measure the same policy."""
    from services.scheduler.config import SchedulerSettings

    return "placement" not in SchedulerSettings.model_fields


def setup_line(opts: Options) -> str:
    return (
        f"crescent up --prefill {opts.prefill} --decode {opts.decode}; transfer {opts.transfer}; "
        f"KV pool {opts.kv_cache_mb} MiB/node; block size {opts.block_size}; "
        f"{opts.max_batched_tokens or 'default'} tokens/step; "
        f"{os.cpu_count()} CPUs; Python {platform.python_version()}"
    )


# ---------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(description="cache-aware placement vs round-robin")
    p.add_argument("--prefill", type=int, default=2, help="prefill nodes (at least 2)")
    p.add_argument("--decode", type=int, default=1, help="decode nodes")
    p.add_argument("--requests", type=int, default=100, help="requests per run (20: smoke)")
    p.add_argument("--speedup", type=float, default=10.0, help="divides trace times; 0: no pacing")
    p.add_argument("--concurrency", type=int, default=0, help="requests in flight at most; 0: any")
    p.add_argument("--transfer", choices=("tcp", "ucx"), default="tcp", help="KV transport")
    p.add_argument("--kv-cache-mb", type=int, default=1024, help="KV pool of each node")
    p.add_argument("--max-batched-tokens", type=int, help="tokens per step; default: the stack's")
    p.add_argument("--tokens-per-block", type=int, default=32, help="tokens per 512-token block")
    p.add_argument("--block-size", type=int, default=32, help="the stack's KV block size")
    p.add_argument("--max-tokens", type=int, default=8, help="completion tokens at most")
    p.add_argument("--trace", type=Path, default=DEFAULT_SLICE, help="trace slice (jsonl)")
    p.add_argument("--placements", nargs="+", choices=PLACEMENTS, default=list(PLACEMENTS))
    p.add_argument("--json", dest="json_path", type=Path, help="write summaries and requests")
    p.add_argument("--keep-data", action="store_true", help="keep each run's data dir and logs")
    a = p.parse_args(argv)
    if a.prefill < 2:
        p.error("--prefill must be at least 2: placement needs a choice")
    if a.requests < 1:
        p.error("--requests must be at least 1")
    return Options(**(vars(a) | {"placements": tuple(a.placements)}))


def write_json(path: Path, opts: Options, runs: list[Run], summaries: dict[str, Any]) -> None:
    payload = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()},
        "summaries": summaries,
        "requests": {r.placement: [asdict(x) for x in r.results] for r in runs},
    }
    path.write_text(json.dumps(payload, indent=1))


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    console = Console()
    conversations = build_workload(
        load_trace(opts.trace), opts.requests, opts.tokens_per_block, opts.max_tokens
    )
    console.print(workload_line(conversations, opts))
    console.print(setup_line(opts))
    if placement_setting_missing():
        console.print(
            "[bold red]warning:[/] the scheduler has no `placement` setting; it ignores "
            "CRESCENT_PLACEMENT, so every column measures its one placement policy"
        )
    runs: list[Run] = []
    try:
        for placement in opts.placements:
            console.print(f"[bold]{placement}[/]: starting a fresh stack …")
            runs.append(run_placement(placement, conversations, opts))
            console.print(f"[bold]{placement}[/]: {len(runs[-1].results)} requests done")
    except BenchError as exc:
        console.print("[red]routing bench failed[/]")
        console.print(str(exc), markup=False, highlight=False)
        if "no prefill node is available" in str(exc):
            console.print(NO_NODE_HINT, markup=False, highlight=False)
        return 1
    summaries = {r.placement: summarize(r) for r in runs}
    console.print(results_table(summaries, "Placement on a multi-turn, shared-prefix workload"))
    if opts.json_path:
        write_json(opts.json_path, opts, runs, summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
