"""The pull wire format and the server's answer, without any transport."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from shared.transfer.base import create_client, create_server
from shared.transfer.tcp import decode_address
from shared.transfer.wire import (
    MAX_BLOCKS_PER_PULL,
    MAX_MESSAGE_BYTES,
    REPLY_HEAD_BYTES,
    REQUEST_HEAD_BYTES,
    PullRequest,
    Reply,
    Status,
    answer,
    decode_reply,
    decode_request,
)
from tests.transfer.peer import LEASE, Blocks


def test_request_round_trips_and_ignores_trailing_bytes() -> None:
    request = PullRequest(2**40 - 1, "lease-é", (0, 7, 2**33), (4, 4, 8), b"\x00addr\xff")
    assert decode_request(request.encode() + b"junk") == request


@pytest.mark.parametrize(
    "message",
    [
        b"XXXX" + PullRequest(1, "l", (1,), (4,)).encode()[4:],
        PullRequest(1, "l", (1,), (4,)).encode()[:-3],
        PullRequest(
            1, "l", (0,) * (MAX_BLOCKS_PER_PULL + 1), (4,) * (MAX_BLOCKS_PER_PULL + 1)
        ).encode(),
    ],
    ids=["bad-magic", "truncated", "too-many-blocks"],
)
def test_malformed_requests_are_refused(message: bytes) -> None:
    with pytest.raises(ValueError):
        decode_request(message)


def test_reply_round_trips_with_a_bounded_message() -> None:
    reply = Reply(9, Status.SIZE_MISMATCH, 0, "x" * (MAX_MESSAGE_BYTES + 50))
    decoded = decode_reply(reply.encode())
    assert (decoded.request_id, decoded.status) == (9, Status.SIZE_MISMATCH)
    assert decoded.message == "x" * MAX_MESSAGE_BYTES


def test_answer_checks_lease_count_sizes_and_layout() -> None:
    blocks = Blocks(3, 16)

    def ask(lease: str, ids: tuple[int, ...], sizes: tuple[int, ...]) -> Status:
        return answer(blocks, PullRequest(1, lease, ids, sizes)).reply.status

    ok = answer(blocks, PullRequest(1, LEASE, (2, 0), (16, 16)))
    assert ok.reply.status == Status.OK and ok.reply.total_bytes == 32
    assert bytes(ok.views[0]) == blocks.pool[2].tobytes()
    assert ask("nope", (0,), (16,)) == Status.UNKNOWN_LEASE
    assert ask("broken", (0,), (16,)) == Status.INTERNAL
    assert ask(LEASE, (0, 1), (16, 15)) == Status.SIZE_MISMATCH
    strided = answer(
        lambda lease, ids: [np.zeros(32, np.uint8)[::2]], PullRequest(1, "l", (0,), (16,))
    )
    assert strided.reply.status == Status.INTERNAL
    short = answer(lambda lease, ids: [], PullRequest(1, "l", (0,), (16,)))
    assert short.reply.status == Status.INTERNAL


def test_tcp_server_answers_garbage_and_keeps_serving(run: asyncio.Runner) -> None:
    async def scenario() -> None:
        server = create_server("tcp", Blocks(2, 64))
        await server.start()
        host, port = decode_address(server.address)
        loop = asyncio.get_running_loop()
        with socket.create_connection((host, port)) as sock:
            sock.setblocking(False)
            # exactly one request head: nothing left unread, so the hang-up is a clean one
            await loop.sock_sendall(sock, b"G" * REQUEST_HEAD_BYTES)
            reply = decode_reply(await loop.sock_recv(sock, REPLY_HEAD_BYTES + MAX_MESSAGE_BYTES))
            assert reply.status == Status.BAD_REQUEST
            assert await loop.sock_recv(sock, 1) == b""  # and it hangs up
        dest = [np.zeros(64, np.uint8)]
        assert await create_client("tcp").pull(server.address, LEASE, [1], dest) == 64
        await server.close()

    run.run(scenario())
