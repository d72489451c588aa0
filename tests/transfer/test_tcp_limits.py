"""The TCP block server against clients that stall, idle, flood or lie, over real sockets.

Each test runs a server in this process with short limits and checks two things: the abusive
connections are dropped in time, and a well-behaved pull next to them still succeeds quickly.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import tracemalloc
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from shared.transfer import wire
from shared.transfer.tcp import TcpTransferServer, decode_address, recv_exactly
from shared.transfer.tcp_channel import PlainChannel
from shared.transfer.tcp_client import TcpTransferClient
from shared.transfer.wire import PullRequest, Status
from tests.support.wait import wait_for_condition

BLOCK = 65_536
BLOCKS = [np.full(BLOCK, i, dtype=np.uint8) for i in range(8)]
LEASE = "lease-1"
DEADLINE_S = 0.3  # the read deadline and idle timeout the servers here run with
HEALTHY_PULL_S = 0.5  # generous for a 512 KiB pull on loopback, even on a busy host
_REQUEST_HEAD = struct.Struct("<4sHHQHI")  # the wire layout, spelled out independently
# What answering the largest request may take: its bytes, and per block an id, a size and a
# view of the block. A buffer sized by what the blocks claim would be exabytes.
MAX_REQUEST_COST = 16 * 2**20


def provider(lease_id: str, block_ids: Sequence[int]) -> list[np.ndarray] | None:
    return [BLOCKS[i % len(BLOCKS)] for i in block_ids] if lease_id == LEASE else None


@asynccontextmanager
async def serving(**limits: Any) -> AsyncIterator[TcpTransferServer]:
    server = TcpTransferServer(provider, **limits)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


async def connect(server: TcpTransferServer) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, decode_address(server.address))
    return sock


async def closed_at(sock: socket.socket, limit_s: float) -> float:
    """When the server closes ``sock`` (``time.monotonic()``); fails if still open after
    ``limit_s``. Whatever the server sends first is read and ignored."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(limit_s):
        while True:
            try:
                if not await loop.sock_recv(sock, 65_536):
                    break
            except ConnectionResetError:
                break
    return time.monotonic()


async def until_connections(server: TcpTransferServer, count: int) -> None:
    await wait_for_condition(lambda: server.connections == count, f"{count} connections")


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (a non-blocking socket it sent nothing)."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def healthy_pull(server: TcpTransferServer) -> float:
    client = TcpTransferClient(timeout_s=5.0)
    dest = [np.zeros(BLOCK, dtype=np.uint8) for _ in range(8)]
    start = time.monotonic()
    await client.pull(server.address, LEASE, list(range(8)), dest)
    elapsed = time.monotonic() - start
    await client.close()
    assert all((d == i).all() for i, d in enumerate(dest))
    return elapsed


def request_bytes(ids: Sequence[int], sizes: Sequence[int]) -> bytes:
    return PullRequest(1, LEASE, tuple(ids), tuple(sizes)).encode()


@pytest.mark.parametrize("style", ["partial-header", "trickling-body"])
def test_a_slow_request_is_dropped_at_the_read_deadline(run: asyncio.Runner, style: str) -> None:
    async def scenario() -> None:
        async with serving(read_timeout_s=DEADLINE_S, idle_timeout_s=30.0) as server:
            message = request_bytes(range(64), [BLOCK] * 64)
            slow = [await connect(server) for _ in range(20)]
            sent_at = time.monotonic()
            for sock in slow:
                sock.send(message[: 5 if style == "partial-header" else wire.REQUEST_HEAD_BYTES])

            async def trickle(sock: socket.socket) -> None:
                for byte in message[wire.REQUEST_HEAD_BYTES : -1]:  # never the whole request
                    sock.send(bytes([byte]))
                    await asyncio.sleep(DEADLINE_S / 10)  # a slow client's pace, on purpose

            feeders = [asyncio.create_task(trickle(s)) for s in slow if style != "partial-header"]
            await healthy_pull(server)
            # Served while the slow ones were held (an order, not a time a busy host stretches).
            assert not any(closed_by_server(s) for s in slow)
            # Bytes keep coming on the trickling ones: the deadline is for the whole request.
            drops = await asyncio.gather(*(closed_at(s, 10 * DEADLINE_S) for s in slow))
            assert min(drops) - sent_at > DEADLINE_S * 0.9
            assert max(drops) - sent_at < 5 * DEADLINE_S
            for task in feeders:
                task.cancel()
            await asyncio.gather(*feeders, return_exceptions=True)
            assert await healthy_pull(server) < HEALTHY_PULL_S
            for sock in slow:
                sock.close()

    run.run(scenario())


def test_idle_connections_are_dropped_and_the_client_pool_recovers(run: asyncio.Runner) -> None:
    async def scenario() -> None:
        async with serving(idle_timeout_s=DEADLINE_S) as server:
            silent = await connect(server)
            opened_at = time.monotonic()
            assert await closed_at(silent, 10 * DEADLINE_S) - opened_at > DEADLINE_S * 0.9
            client = TcpTransferClient(timeout_s=5.0)
            dest = [np.zeros(BLOCK, dtype=np.uint8)]
            await client.pull(server.address, LEASE, [3], dest)
            await until_connections(server, 0)  # the server drops the pooled connection
            start = time.monotonic()
            await client.pull(server.address, LEASE, [5], dest)  # on a new connection
            assert time.monotonic() - start < HEALTHY_PULL_S
            assert (dest[0] == 5).all()
            await client.close()
            silent.close()

    run.run(scenario())


def test_a_flood_of_idle_connections_cannot_keep_a_pull_out(run: asyncio.Runner) -> None:
    async def scenario() -> None:
        async with serving(max_connections=16, idle_timeout_s=30.0) as server:
            flood = [await connect(server) for _ in range(100)]
            # Every one accepted: all but the 16 newest were dropped to make room.
            await wait_for_condition(
                lambda: sum(map(closed_by_server, flood)) >= 100 - 16, "84 idle ones dropped"
            )
            assert server.connections <= 16
            # A new connection takes the place of the one idle the longest.
            assert await healthy_pull(server) < HEALTHY_PULL_S
            assert server.connections <= 16
            for sock in flood:
                sock.close()

    run.run(scenario())


def test_connections_over_the_cap_are_closed_unread(run: asyncio.Runner) -> None:
    async def scenario() -> None:
        async with serving(max_connections=8, read_timeout_s=30.0) as server:
            busy = [await connect(server) for _ in range(8)]
            for sock in busy:  # mid-request: nothing idle to make room with
                sock.send(b"CKVT")
            await wait_for_condition(
                lambda: len(server._deadlines.reading) == 8,  # mid-request, as it sees them
                "the server reading a request on all eight",
            )
            excess, opened_at = await connect(server), time.monotonic()
            excess.send(request_bytes([0], [BLOCK]))
            assert await closed_at(excess, 1.0) - opened_at < 0.5
            assert server.connections_refused >= 1
            assert server.connections == 8
            for sock in busy:
                sock.close()
            await until_connections(server, 0)
            assert await healthy_pull(server) < HEALTHY_PULL_S
            excess.close()

    run.run(scenario())


async def reply_to(server: TcpTransferServer, message: bytes) -> wire.Reply:
    loop, sock = asyncio.get_running_loop(), await connect(server)
    try:
        await loop.sock_sendall(sock, message)
        async with asyncio.timeout(2.0):
            head = memoryview(bytearray(wire.REPLY_HEAD_BYTES))
            await recv_exactly(PlainChannel(sock), head)
            text = memoryview(bytearray(wire.reply_message_bytes(head)))
            await recv_exactly(PlainChannel(sock), text)
    finally:
        sock.close()
    return wire.decode_reply(bytes(head) + bytes(text))


def test_huge_announced_sizes_cost_no_more_than_the_protocol_limits(
    run: asyncio.Runner,
) -> None:
    async def scenario() -> None:
        async with serving() as server:
            tracemalloc.start()
            try:
                # Every block claims an exabyte: refused by size, nothing allocated by it.
                n = wire.MAX_BLOCKS_PER_PULL
                reply = await reply_to(server, request_bytes(range(n), [2**60] * n))
                assert reply.status == Status.SIZE_MISMATCH
                # A header announcing more blocks or bytes than the protocol allows is refused
                # before its body is read.
                limits = ((0, 0, 2**32 - 1), (60_000, 0, 1), (0, 60_000, 1))
                for lease_len, reply_len, count in limits:
                    head = _REQUEST_HEAD.pack(
                        wire.MAGIC, wire.VERSION, lease_len, 7, reply_len, count
                    )
                    assert (await reply_to(server, head)).status == Status.BAD_REQUEST
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < MAX_REQUEST_COST
            assert await healthy_pull(server) < HEALTHY_PULL_S

    run.run(scenario())
