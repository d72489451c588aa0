"""KV block pulls over UCX and TCP between two processes, against memcpy of the same bytes.

A batch is ceil(size / block_bytes) blocks of the real block size (1,474,560 B for the default
model at 32 tokens per block), pulled from a server process into preallocated, already touched
destination blocks. Each figure is the median GB/s of several timed rounds after warm-up rounds;
memcpy copies the same blocks one by one with ``np.copyto`` in this process.

    .venv/bin/python bench/transfer.py [--rounds 15] [--warmup 3] [--sizes-mib 1 16 64] [--busy N]

Each variant runs in a fresh pair of processes, one after the other, so that only two processes
compete for the cores at a time: a UCX process in polling mode keeps a core busy even when idle.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

import numpy as np
from rich.console import Console
from rich.table import Table

from shared.transfer.base import BufferLike, create_client, create_server

BLOCK_BYTES = 1_474_560
LEASE = "bench"
# (column, transport, environment of both processes). "UCX safe" is what the services run by
# default: endpoints with peer error handling (a dying peer fails pulls, not the process), on
# UCX's newer protocol layer, with the shared-memory transports told to take part
# (shared/transfer/ucx_settings.py); a waiting pull polls UCX, an idle process sleeps in epoll.
# "UCX unsafe" is CRESCENT_UCX_ERROR_HANDLING=off: no error handling, UCX's older protocol
# layer, faster, but a dying peer can abort the puller; "unsafe v2" is the same on the newer
# layer, which tells the cost of error handling from that of the layer. "safe, TCP" is error
# handling on without those shared-memory settings, where UCX itself falls back to TCP. "safe
# polling" polls for as long as anything waits, a server's wait for requests included (a core
# per process, always); "safe thread" leaves progress to ucxx's progress thread. Every UCX
# variant but "safe, TCP" copies blocks out of the server's memory with CMA.
_SAFE_TCP = {"UCX_MM_ERROR_HANDLING": "n", "UCX_CMA_MEMORY_INVALIDATE": "n"}
VARIANTS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("UCX safe", "ucx", {"CRESCENT_UCX_PROGRESS": "adaptive"}),
    ("UCX unsafe", "ucx", {"CRESCENT_UCX_ERROR_HANDLING": "off"}),
    ("UCX unsafe v2", "ucx", {"CRESCENT_UCX_ERROR_HANDLING": "off", "UCX_PROTO_ENABLE": "y"}),
    ("UCX safe, TCP", "ucx", _SAFE_TCP),
    ("UCX safe polling", "ucx", {"CRESCENT_UCX_PROGRESS": "polling"}),
    ("UCX safe thread", "ucx", {"CRESCENT_UCX_PROGRESS": "thread"}),
    ("TCP", "tcp", {}),
)


def make_blocks(count: int, nbytes: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, nbytes, dtype=np.uint8) for _ in range(count)]


def serve(kind: str, count: int, nbytes: int, conn: Connection) -> None:
    """The server process: hold ``count`` blocks under one lease until told to stop."""
    blocks = make_blocks(count, nbytes, seed=7)

    def provider(lease_id: str, block_ids: Sequence[int]) -> Sequence[BufferLike] | None:
        return [blocks[i] for i in block_ids] if lease_id == LEASE else None

    async def run() -> None:
        server = create_server(kind, provider)
        await server.start()
        conn.send(server.address)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await server.close()

    asyncio.run(run())


def spin() -> None:
    """A process that only burns CPU, standing in for the rest of a busy host."""
    while True:
        pass


def median_gbps(nbytes: int, seconds: list[float]) -> float:
    return nbytes / statistics.median(seconds) / 1e9


def bench_memcpy(count: int, nbytes: int, rounds: int, warmup: int) -> float:
    src = make_blocks(count, nbytes, seed=1)
    dst = [np.ones(nbytes, dtype=np.uint8) for _ in range(count)]
    times = []
    for i in range(warmup + rounds):
        start = time.perf_counter()
        for s, d in zip(src, dst, strict=True):
            np.copyto(d, s)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return median_gbps(count * nbytes, times)


async def bench_pulls(
    kind: str, address: bytes, counts: list[int], nbytes: int, rounds: int, warmup: int
) -> dict[int, float]:
    client = create_client(kind, timeout_s=60.0)
    # Touched up front: first-touch page faults are allocation cost, not transfer speed.
    dest = [np.ones(nbytes, dtype=np.uint8) for _ in range(max(counts))]
    expected = [bytes(b) for b in make_blocks(max(counts), nbytes, seed=7)]
    results: dict[int, float] = {}
    for count in counts:
        ids = list(range(count))
        times = []
        for i in range(warmup + rounds):
            start = time.perf_counter()
            await client.pull(address, LEASE, ids, dest[:count])
            if i >= warmup:
                times.append(time.perf_counter() - start)
        if [bytes(d) for d in dest[:count]] != expected[:count]:
            raise SystemExit(f"{kind}: pulled bytes differ from the server's")
        results[count] = median_gbps(count * nbytes, times)
    await client.close()
    return results


def client_side(
    kind: str,
    address: bytes,
    counts: list[int],
    nbytes: int,
    rounds: int,
    warmup: int,
    conn: Connection,
) -> None:
    """The pulling process: its own process, so each variant gets a fresh UCX configuration."""
    conn.send(asyncio.run(bench_pulls(kind, address, counts, nbytes, rounds, warmup)))


def run_variant(
    kind: str, env: dict[str, str], counts: list[int], nbytes: int, rounds: int, warmup: int
) -> dict[int, float]:
    ctx = mp.get_context("spawn")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # spawned children copy the environment as they start
    server_end, server_conn = ctx.Pipe()
    client_end, client_conn = ctx.Pipe()
    server = ctx.Process(target=serve, args=(kind, max(counts), nbytes, server_conn))
    server.start()
    try:
        address = server_end.recv()
        args = (kind, address, counts, nbytes, rounds, warmup, client_conn)
        client = ctx.Process(target=client_side, args=args)
        client.start()
        results: dict[int, float] = client_end.recv()
        client.join(30)
        return results
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server_end.send("stop")
        server.join(30)
        if server.is_alive():
            server.kill()


def ratio(value: float, base: float) -> str:
    return f"{value:.2f} ({value / base:.0%})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--block-bytes", type=int, default=BLOCK_BYTES)
    parser.add_argument("--busy", type=int, default=0, help="CPU-burning processes beside")
    args = parser.parse_args()
    hogs = [mp.get_context("spawn").Process(target=spin, daemon=True) for _ in range(args.busy)]
    for hog in hogs:
        hog.start()
    nbytes = args.block_bytes
    counts = [math.ceil(mib * 2**20 / nbytes) for mib in args.sizes_mib]

    memcpy = {c: bench_memcpy(c, nbytes, args.rounds, args.warmup) for c in counts}
    measured = {
        name: run_variant(kind, env, counts, nbytes, args.rounds, args.warmup)
        for name, kind, env in VARIANTS
    }

    table = Table(
        title=f"KV pull between two processes, GB/s (share of memcpy); median of {args.rounds}",
        caption=f"block {nbytes:,} B; busy processes beside: {args.busy}",
    )
    for header in ("batch", "blocks", "bytes", "memcpy", *(name for name, _, _ in VARIANTS)):
        table.add_column(header, justify="right")
    for mib, count in zip(args.sizes_mib, counts, strict=True):
        base = memcpy[count]
        cells = [ratio(measured[name][count], base) for name, _, _ in VARIANTS]
        table.add_row(f"{mib} MiB", str(count), f"{count * nbytes:,}", f"{base:.2f}", *cells)
    Console(width=160).print(table)
    for hog in hogs:
        hog.kill()


if __name__ == "__main__":
    main()
