"""cachemeta benchmark: a large catalogue in Postgres, MatchPrefix latency over gRPC, restart time.

    .venv/bin/python bench/cachemeta.py                      # 1M blocks, 64 nodes (minutes)
    .venv/bin/python bench/cachemeta.py --blocks 20000 --nodes 8   # quick

It creates a fresh Postgres database (dropped at the end), runs ``python -m services.cachemeta``
in a child process on it, registers the workload, then measures. Workload: ``--roots`` shared
system prompts of ``--shared-blocks`` blocks each; conversations extend one of them to a chain of
``--chain`` blocks; each conversation is held by 1 to 3 random (node, tier) holders, each of which
registers the whole chain, so the roots end up held by many nodes.

To measure something else against the same catalogue, write an ``async def (client, chains)``
like ``match_latency`` and call it from ``run``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import numpy as np
from placement import placement_rate, scope_root  # bench/ is first on sys.path
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from shared.kv.hashing import hash_block_tokens
from shared.rpc.client import CacheMetaClient, CacheMetaUnavailable
from shared.rpc.types import BlockRecord

ROOT_DIR = Path(__file__).resolve().parents[1]
BLOCK_TOKENS = 32
BLOCK_BYTES = 32 * 46_080  # a SmolLM2 fp32 block
console = Console()


@dataclass(frozen=True)
class LatencyStats:
    calls: int
    in_flight: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds


class Workload:
    """Deterministic chains: tokens from a per-chain seed, hashes computed once and kept."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.rng = random.Random(args.seed)
        self.scope = scope = scope_root()  # the scheduler's root for the benchmark's tenant
        own = args.chain - args.shared_blocks
        roots = max(1, args.roots)
        num_convs = max(1, (args.blocks - roots * args.shared_blocks) // own)
        self.roots = [self._hashes(scope, ("root", r), args.shared_blocks) for r in range(roots)]
        self.root_of = [self.rng.randrange(roots) for _ in range(num_convs)]
        self.own_len = own
        self.chains: list[list[bytes]] = []
        for c in range(num_convs):
            root = self.roots[self.root_of[c]]
            self.chains.append(root + self._hashes(root[-1], ("conv", c), own))
        holders = [(f"node-{n:02d}", tier) for n in range(args.nodes) for tier in ("dram", "nvme")]
        self.held: dict[tuple[str, str], list[int]] = {h: [] for h in holders}
        for c in range(num_convs):
            for holder in self.rng.sample(holders, self.rng.choice((1, 2, 2, 3))):
                self.held[holder].append(c)
        self.unique_blocks = len(set(self.root_of)) * args.shared_blocks + num_convs * own

    @staticmethod
    def _tokens(key: tuple[str, int], count: int) -> np.ndarray:
        seed = (1 if key[0] == "root" else 2) << 40 | key[1]
        rng = np.random.default_rng(seed)
        return rng.integers(0, 49_152, size=(count, BLOCK_TOKENS), dtype=np.uint32)

    def _hashes(self, parent: bytes, key: tuple[str, int], count: int) -> list[bytes]:
        out = []
        for row in self._tokens(key, count).tolist():
            parent = hash_block_tokens(parent, row)
            out.append(parent)
        return out

    def _chain_tokens(self, conv: int) -> np.ndarray:
        """``[blocks, BLOCK_TOKENS]``: the tokens of a conversation's whole chain."""
        root = self.root_of[conv]
        return np.concatenate(
            [
                self._tokens(("root", root), len(self.roots[root])),
                self._tokens(("conv", conv), self.own_len),
            ]
        )

    def prompt(self, conv: int) -> list[int]:
        """The tokens of a conversation's chain plus one: a prompt whose every block may hit."""
        return [*self._chain_tokens(conv).ravel().tolist(), 1]

    def records(self, conv: int) -> list[BlockRecord]:
        chain = self.chains[conv]
        parents = [self.scope, *chain[:-1]]
        return [
            BlockRecord(h, p, t, BLOCK_BYTES, int.from_bytes(h[:8], "little"))
            for h, p, t in zip(chain, parents, self._chain_tokens(conv).tolist(), strict=True)
        ]


async def register_all(client: CacheMetaClient, work: Workload, batch: int) -> tuple[int, float]:
    """Registers every holder's chains in batches of about ``batch`` blocks, 2 calls in flight."""
    queue: asyncio.Queue[tuple[str, str, list[BlockRecord]] | None] = asyncio.Queue(maxsize=4)
    total = sum(len(convs) for convs in work.held.values()) * len(work.chains[0])
    started = time.perf_counter()

    async def sender() -> None:
        while (item := await queue.get()) is not None:
            node, tier, records = item
            await client.register_blocks(node, tier, records)
            progress.update(task, advance=len(records))

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("registering replicas", total=total)
        senders = [asyncio.create_task(sender()) for _ in range(2)]
        for (node, tier), convs in work.held.items():
            pending: list[BlockRecord] = []
            for conv in convs:
                pending.extend(work.records(conv))
                if len(pending) >= batch:
                    await queue.put((node, tier, pending))
                    pending = []
            if pending:
                await queue.put((node, tier, pending))
        for _ in senders:
            await queue.put(None)
        await asyncio.gather(*senders)
    return total, time.perf_counter() - started


async def match_latency(
    client: CacheMetaClient, chains: Sequence[list[bytes]], *, calls: int, in_flight: int
) -> LatencyStats:
    """MatchPrefix of ``calls`` chains taken round-robin, ``in_flight`` at a time."""
    return await call_latency(
        lambda i: client.match_prefix(chains[i % len(chains)]), calls, in_flight
    )


async def call_latency(
    call: Callable[[int], Awaitable[object]], calls: int, in_flight: int
) -> LatencyStats:
    """Latency of ``call(i)`` for i in range(calls), ``in_flight`` at a time (after a warmup)."""
    for i in range(min(100, calls)):
        await call(i)
    latencies: list[float] = []
    next_call = iter(range(calls))

    async def worker() -> None:
        for i in next_call:
            started = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    seconds = time.perf_counter() - started
    q = statistics.quantiles(latencies, n=100)
    return LatencyStats(calls, in_flight, seconds, q[49] * 1e3, q[98] * 1e3, max(latencies) * 1e3)


class ServiceProcess:
    """``python -m services.cachemeta`` in a child process; owns it and its log file."""

    def __init__(self, db_url: str, port: int, log: Path) -> None:
        self.env = os.environ | {
            "CRESCENT_DB_URL": db_url,
            "CRESCENT_CACHEMETA_PORT": str(port),
            "CRESCENT_REPLICA_GRACE_S": "3600",
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "services.cachemeta"],
                cwd=ROOT_DIR,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    async def ready(self, client: CacheMetaClient, timeout_s: float = 600) -> float:
        started = time.perf_counter()
        while time.perf_counter() - started < timeout_s:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"cachemeta exited:\n{self.log.read_text()[-3000:]}")
            try:
                await client.list_nodes()
                return time.perf_counter() - started
            except CacheMetaUnavailable:
                await asyncio.sleep(0.05)
        raise TimeoutError("cachemeta did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def rss_mib(self) -> float:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.findall(r"VmRSS:\s+(\d+) kB", status)[0]) / 1024

    def cpu_seconds(self) -> float:
        """User + system CPU time the service process has used."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def last_load_seconds(self) -> float:
        found = re.findall(r"index loaded: .* in ([0-9.]+) s", self.log.read_text())
        return float(found[-1]) if found else float("nan")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def measure_placements(
    client: CacheMetaClient, work: Workload, args: argparse.Namespace, rows: list[tuple[str, str]]
) -> None:
    """The scheduler's whole placement path for prompts of whole held chains."""
    rng = random.Random(args.seed + 2)
    convs = rng.sample(range(len(work.chains)), min(200, len(work.chains)))
    prompts = [work.prompt(c) for c in convs]
    nodes = [f"node-{n:02d}" for n in range(args.nodes)]
    for in_flight in (1, 32):
        s = await placement_rate(client, prompts, nodes, calls=args.placements, in_flight=in_flight)
        rows.append(
            (
                f"scheduler placements, {len(prompts[0]):,}-token prompts, {in_flight} in flight",
                f"{s.per_s:,.0f} placements/s  p50 {s.p50_ms:.2f} ms  p99 {s.p99_ms:.2f} ms  "
                f"({s.with_pull:,} of {s.placements:,} with a pull planned, "
                f"{s.rejected} rejected)",
            )
        )


async def run(args: argparse.Namespace) -> None:
    name = f"crescent_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(args.pg_dsn, timeout=5)
    await admin.execute(f'CREATE DATABASE "{name}"')
    host = args.pg_dsn.split("://", 1)[1].rsplit("/", 1)[0]
    port = free_port()
    log = Path(args.log)
    log.write_text("")
    service = ServiceProcess(f"postgresql+asyncpg://{host}/{name}", port, log)
    client = CacheMetaClient(f"127.0.0.1:{port}", timeout_s=120, max_in_flight=64)
    rows: list[tuple[str, str]] = []
    try:
        rows.append(("load average at the start", " ".join(f"{x:.1f}" for x in os.getloadavg())))
        t = time.perf_counter()
        work = Workload(args)
        console.print(
            f"workload: {work.unique_blocks:,} blocks in {len(work.chains):,} chains of "
            f"{len(work.chains[0])}, {args.nodes} nodes ({time.perf_counter() - t:.1f} s to hash)"
        )
        service.start()
        await service.ready(client)
        replicas, seconds = await register_all(client, work, args.batch)
        stats = await client.stats()
        assert stats.num_blocks == work.unique_blocks, stats
        rows.append(("catalogue", f"{stats.num_blocks:,} blocks, {stats.num_replicas:,} replicas"))
        rows.append(("register", f"{replicas / seconds:,.0f} replicas/s ({seconds:.1f} s)"))
        rows.append(("service memory", f"{service.rss_mib():,.0f} MiB resident"))
        t = time.perf_counter()
        await client.stats()
        rows.append(("Stats call", f"{(time.perf_counter() - t) * 1e3:.0f} ms"))

        # 80% whole chains that are held somewhere, 20% a shared root then unknown blocks.
        rng = random.Random(args.seed + 1)
        probes = [rng.choice(work.chains) for _ in range(800)]
        for _ in range(200):
            root = rng.choice(work.roots)
            probes.append(root + [secrets.token_bytes(16) for _ in range(args.chain - len(root))])
        rng.shuffle(probes)
        for in_flight in (1, 32):
            cpu = service.cpu_seconds()
            s = await match_latency(client, probes, calls=args.matches, in_flight=in_flight)
            cpu_ms = (service.cpu_seconds() - cpu) / (s.calls + min(100, s.calls)) * 1e3
            rows.append(
                (
                    f"MatchPrefix {args.chain} blocks, {in_flight} in flight",
                    f"p50 {s.p50_ms:.2f} ms  p99 {s.p99_ms:.2f} ms  max {s.max_ms:.1f} ms  "
                    f"{s.calls_per_s:,.0f} calls/s  (service CPU {cpu_ms:.2f} ms/call)",
                )
            )

        await measure_placements(client, work, args, rows)

        service.stop()
        service.start()
        ready_s = await service.ready(client)
        found = await client.match_prefix(work.chains[0])
        assert found and found[0].num_blocks == args.chain, found
        rows.append(
            (
                "restart",
                f"index load {service.last_load_seconds():.1f} s, ready after {ready_s:.1f} s",
            )
        )
    finally:
        await client.close()
        service.stop()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    rows.append(("load average at the end", " ".join(f"{x:.1f}" for x in os.getloadavg())))
    table = Table(title=f"cachemeta on Postgres, {args.blocks:,} blocks, {args.nodes} nodes")
    table.add_column("measure")
    table.add_column("result")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=1_000_000, help="distinct blocks")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--chain", type=int, default=128, help="blocks per chain")
    parser.add_argument("--shared-blocks", type=int, default=32, help="blocks of a shared root")
    parser.add_argument("--roots", type=int, default=64, help="shared roots (system prompts)")
    parser.add_argument("--batch", type=int, default=4096, help="blocks per RegisterBlocks")
    parser.add_argument("--matches", type=int, default=5000, help="MatchPrefix calls per run")
    parser.add_argument("--placements", type=int, default=3000, help="placements per run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--pg-dsn",
        default=os.environ.get(
            "CRESCENT_BENCH_POSTGRES_DSN", "postgresql://postgres@127.0.0.1/test"
        ),
        help="an existing database on the server; the benchmark creates its own beside it",
    )
    parser.add_argument("--log", default="/tmp/crescent-bench-cachemeta.log")
    args = parser.parse_args()
    if not 0 < args.shared_blocks < args.chain:
        parser.error("--shared-blocks must be between 0 and --chain")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
