"""What TLS costs on the internal links, in clear and with TLS side by side, in one run.

KV pulls over TCP: a server process per mode holds 16 blocks of the real block size
(1,474,560 B); this process pulls all 16 at once (MB/s, median of the timed rounds) and one block
at a time (its latency, median and p90), the two modes taking turns so that both see the same
load on the host. NATS: a responder and a requester on one server, request/reply round
trips of a small message (median and p99). Then the cipher alone, in memory: TLS records as the
pulls use them, against AES-256-GCM of a whole block with a key per lease (the alternative to
TLS for pulls). Certificates are made for the run (crescent.certs).

    .venv/bin/python bench/tls_cost.py [--rounds 20] [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crescent.certs import CertFiles, write_cert
from crescent.nats_tls import tls_section
from shared.bus import NatsBus
from shared.messages import WireMessage
from shared.tls import TlsSettings
from shared.transfer.base import BufferLike
from shared.transfer.tcp import TcpTransferServer
from shared.transfer.tcp_channel import SEND_BYTES
from shared.transfer.tcp_client import TcpTransferClient

BLOCK_BYTES = 1_474_560
BLOCKS = 16
LEASE = "bench"


class Echo(WireMessage, kw_only=True):
    n: int


def settings(files: CertFiles | None) -> TlsSettings:
    if files is None:
        return TlsSettings(tls="off")
    return TlsSettings(
        tls="on", tls_ca_file=files.ca, tls_cert_file=files.cert, tls_key_file=files.key
    )


def serve_blocks(files: CertFiles | None, conn: Connection) -> None:
    rng = np.random.default_rng(7)
    blocks = [rng.integers(0, 256, BLOCK_BYTES, dtype=np.uint8) for _ in range(BLOCKS)]

    def provide(lease: str, ids: Sequence[int]) -> Sequence[BufferLike] | None:
        return [blocks[i] for i in ids] if lease == LEASE else None

    async def run() -> None:
        server = TcpTransferServer(provide, "127.0.0.1", tls=settings(files))
        await server.start()
        conn.send(server.address)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await server.close()

    asyncio.run(run())


async def pulls(
    clients: dict[str, TcpTransferClient], addresses: dict[str, bytes], rounds: int
) -> dict[str, dict[str, float]]:
    """Both modes' pulls interleaved, round by round, so that both see the same load."""
    dest = [np.ones(BLOCK_BYTES, dtype=np.uint8) for _ in range(BLOCKS)]
    ids = list(range(BLOCKS))
    whole: dict[str, list[float]] = {mode: [] for mode in clients}
    single: dict[str, list[float]] = {mode: [] for mode in clients}
    for mode, client in clients.items():  # connects (and shakes hands) untimed
        await client.pull(addresses[mode], LEASE, ids, dest)
    for i in range(rounds * BLOCKS):
        for mode, client in clients.items():
            if i < rounds:
                start = time.perf_counter()
                await client.pull(addresses[mode], LEASE, ids, dest)
                whole[mode].append(time.perf_counter() - start)
            start = time.perf_counter()
            await client.pull(addresses[mode], LEASE, [i % BLOCKS], dest[:1])
            single[mode].append(time.perf_counter() - start)
    for client in clients.values():
        await client.close()
    return {
        mode: {
            "pull 16 blocks, MB/s": BLOCKS * BLOCK_BYTES / statistics.median(whole[mode]) / 1e6,
            "pull 1 block, median ms": statistics.median(single[mode]) * 1e3,
            "pull 1 block, p90 ms": float(np.percentile(single[mode], 90)) * 1e3,
        }
        for mode in clients
    }


def measure_pulls(modes: dict[str, CertFiles | None], rounds: int) -> dict[str, dict[str, float]]:
    ctx = mp.get_context("spawn")
    pipes, servers, addresses = [], [], {}
    try:
        for mode, files in modes.items():
            ours, theirs = ctx.Pipe()
            server = ctx.Process(target=serve_blocks, args=(files, theirs))
            server.start()
            pipes.append(ours)
            servers.append(server)
            addresses[mode] = ours.recv()
        clients = {
            mode: TcpTransferClient(timeout_s=60.0, tls=settings(files))
            for mode, files in modes.items()
        }
        return asyncio.run(pulls(clients, addresses, rounds))
    finally:
        for pipe in pipes:
            pipe.send("stop")
        for server in servers:
            server.join(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_nats(folder: Path, files: CertFiles | None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = folder / f"nats-{'tls' if files else 'clear'}.conf"
    block = tls_section(settings(files)).get("tls")
    lines = [f"listen: 127.0.0.1:{port}"]
    if isinstance(block, dict):
        items = "\n".join(f"  {key}: {json.dumps(value)}" for key, value in block.items())
        lines.append("tls {\n" + items + "\n}")
    config.write_text("\n".join(lines) + "\n")
    binary = Path(sys.executable).parent / "nats-server"
    proc = subprocess.Popen([str(binary), "-c", str(config)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"nats://127.0.0.1:{port}"
        time.sleep(0.02)
    proc.kill()
    raise SystemExit("nats-server did not start")


async def requests(url: str, files: CertFiles | None, count: int) -> dict[str, float]:
    responder = await NatsBus.connect(url, "bench-responder", tls=settings(files))
    requester = await NatsBus.connect(url, "bench-requester", tls=settings(files))

    async def echo(message: Echo) -> Echo:
        return message

    await responder.serve("bench.echo", Echo, echo)
    await responder.flush()
    times = []
    for i in range(count + 100):
        start = time.perf_counter()
        await requester.request("bench.echo", Echo(n=i), Echo, timeout_s=5)
        if i >= 100:  # warm-up
            times.append(time.perf_counter() - start)
    await requester.close()
    await responder.close()
    return {
        "NATS request/reply, median ms": statistics.median(times) * 1e3,
        "NATS request/reply, p99 ms": float(np.percentile(times, 99)) * 1e3,
    }


def measure_nats(folder: Path, files: CertFiles | None, count: int) -> dict[str, float]:
    proc, url = start_nats(folder, files)
    try:
        return asyncio.run(requests(url, files, count))
    finally:
        proc.terminate()
        proc.wait(10)


def paired_tls(files: CertFiles) -> tuple[ssl.SSLObject, ssl.SSLObject, list[ssl.MemoryBIO]]:
    """A server and a client TLS state joined in memory, handshake done."""
    tls = settings(files)
    bios = [ssl.MemoryBIO() for _ in range(4)]  # server in, out; client in, out
    server_context = tls.server_context("bench", "localhost")
    client_context = tls.client_context("bench", "localhost")
    assert server_context is not None and client_context is not None
    server = server_context.wrap_bio(bios[0], bios[1], server_side=True)
    client = client_context.wrap_bio(bios[2], bios[3], server_hostname="localhost")
    for _ in range(4):
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
        bios[0].write(bios[3].read())
        bios[2].write(bios[1].read())
    return server, client, bios


def cipher_costs(files: CertFiles, rounds: int) -> dict[str, float]:
    """Milliseconds per block of the cipher alone, in memory: TLS records as the pulls use them
    (``tcp_channel``), and AES-256-GCM over the whole block with a key per lease instead."""
    block = np.random.default_rng(1).integers(0, 256, BLOCK_BYTES, dtype=np.uint8).data
    dest = memoryview(bytearray(BLOCK_BYTES))
    server, client, bios = paired_tls(files)
    aead, nonce = AESGCM(AESGCM.generate_key(bit_length=256)), bytes(12)
    times: dict[str, list[float]] = {}

    def timed(name: str, start: float) -> None:
        times.setdefault(name, []).append(time.perf_counter() - start)

    for _ in range(rounds):
        start = time.perf_counter()
        sealed_parts = []
        for at in range(0, BLOCK_BYTES, SEND_BYTES):  # as TlsChannel.sendall does
            server.write(block[at : at + SEND_BYTES])
            sealed_parts.append(bios[1].read())
        timed("TLS encrypt", start)
        for part in sealed_parts:
            bios[2].write(part)
        start, got = time.perf_counter(), 0
        while got < BLOCK_BYTES:
            got += client.read(BLOCK_BYTES - got, dest[got:])  # type: ignore[operator]
        timed("TLS decrypt", start)
        start = time.perf_counter()
        sealed = aead.encrypt(nonce, block, None)
        timed("AEAD encrypt", start)
        start = time.perf_counter()
        dest[:] = aead.decrypt(nonce, sealed, None)
        timed("AEAD decrypt", start)
    return {f"{name}, ms/block": statistics.median(t) * 1e3 for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20, help="timed 16-block pulls per mode")
    p.add_argument("--requests", type=int, default=2000, help="timed NATS round trips per mode")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        files = write_cert(folder / "certs", "bench")
        modes = {"clear": None, "TLS": files}
        rows: dict[str, dict[str, float]] = {}
        figures = measure_pulls(modes, args.rounds)
        for mode, given in modes.items():
            figures[mode] |= measure_nats(folder, given, args.requests)
        for mode, values in figures.items():
            for name, value in values.items():
                rows.setdefault(name, {})[mode] = value
        cipher = cipher_costs(files, args.rounds * 4)
    print(f"{'':32} {'clear':>10} {'TLS':>10} {'TLS/clear':>10}")
    for name, values in rows.items():
        clear, tls = values["clear"], values["TLS"]
        print(f"{name:32} {clear:10.2f} {tls:10.2f} {tls / clear:10.2f}")
    print("cipher alone, in memory, one 1.5 MB block:")
    for name, value in cipher.items():
        print(f"  {name:30} {value:10.2f}")


if __name__ == "__main__":
    main()
