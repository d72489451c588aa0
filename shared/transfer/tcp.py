"""Block pulls over plain TCP: the fallback transport, and the one for hosts without UCX.

Both ends use raw non-blocking sockets on the event loop rather than asyncio streams: the client
(``tcp_client``) receives each block straight into its destination with ``sock_recv_into``
(streams would copy every byte once more and run at about half the speed), and the server here
sends from the provider's buffers with ``sock_sendall`` without staging them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Coroutine
from typing import Any

from shared.transfer.base import (
    DEFAULT_SEND_TIMEOUT_S,
    BlockProvider,
    TransferError,
)
from shared.transfer.wire import (
    REQUEST_HEAD_BYTES,
    PullRequest,
    Reply,
    Status,
    answer,
    decode_request,
    request_body_bytes,
)

log = logging.getLogger(__name__)

ADDRESS_PREFIX = b"tcp:"
_WILDCARDS = ("", "0.0.0.0", "::")


class PeerClosedError(ConnectionError):
    """The other end closed the connection in the middle of a message."""


async def recv_exactly(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, view: memoryview
) -> None:
    got = 0
    while got < len(view):
        n = await loop.sock_recv_into(sock, view[got:])
        if n == 0:
            raise PeerClosedError(f"connection closed after {got} of {len(view)} bytes")
        got += n


def encode_address(host: str, port: int) -> bytes:
    if host in _WILDCARDS:
        # Bound to every interface, but peers need one they can reach: this host's own name.
        host = socket.gethostbyname(socket.gethostname())
    return ADDRESS_PREFIX + f"{host}:{port}".encode()


def decode_address(address: bytes) -> tuple[str, int]:
    if not address.startswith(ADDRESS_PREFIX):
        raise TransferError(f"not a TCP transfer address: {address[:16]!r}")
    host, _, port = address[len(ADDRESS_PREFIX) :].decode("ascii", "replace").rpartition(":")
    if not host or not port.isdigit():
        raise TransferError(f"malformed TCP transfer address: {address!r}")
    return host.strip("[]"), int(port)


class TcpTransferServer:
    """Serves pulls over TCP on ``host`` and an ephemeral port.

    Owns the listening socket and one task per accepted connection.
    Invariant: a connection carries one pull at a time, in order, so replies never interleave.
    """

    def __init__(
        self,
        provider: BlockProvider,
        host: str = "127.0.0.1",
        *,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
    ) -> None:
        self._provider = provider
        self._host = host
        self._send_timeout_s = send_timeout_s
        self._sock: socket.socket | None = None
        self._address = b""
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: set[socket.socket] = set()
        self.bytes_sent = 0
        self.blocks_sent = 0

    @property
    def address(self) -> bytes:
        if not self._address:
            raise TransferError("the TCP transfer server is not started")
        return self._address

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self._host, 0, type=socket.SOCK_STREAM)
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setblocking(False)
        try:
            sock.bind(sockaddr)
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise TransferError(f"cannot listen on {self._host}: {exc}") from exc
        try:
            self._address = encode_address(self._host, sock.getsockname()[1])
        except OSError as exc:
            sock.close()
            raise TransferError(f"no address to publish for {self._host!r}: {exc}") from exc
        self._sock = sock
        self._spawn(self._accept_loop(sock))

    async def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        for conn in list(self._conns):
            conn.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError:
                if self._sock is None:
                    return  # closed under us: the normal way out
                log.exception("accept failed on the transfer socket")
                await asyncio.sleep(0.1)  # e.g. out of descriptors; do not spin
                continue
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.add(conn)
            self._spawn(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        head = memoryview(bytearray(REQUEST_HEAD_BYTES))
        try:
            while True:
                try:
                    await recv_exactly(loop, conn, head)
                except PeerClosedError:
                    return  # the client hung up between pulls
                try:
                    body = memoryview(bytearray(request_body_bytes(head)))
                except ValueError as exc:
                    # The stream cannot be trusted past a bad header: answer, then hang up.
                    await loop.sock_sendall(
                        conn, Reply(0, Status.BAD_REQUEST, 0, str(exc)).encode()
                    )
                    return
                await recv_exactly(loop, conn, body)
                request = decode_request(bytes(head) + bytes(body))
                await self._send_answer(loop, conn, request)
        except (OSError, TimeoutError) as exc:
            log.info("transfer connection dropped: %s", exc)
        finally:
            self._conns.discard(conn)
            conn.close()

    async def _send_answer(
        self, loop: asyncio.AbstractEventLoop, conn: socket.socket, request: PullRequest
    ) -> None:
        result = answer(self._provider, request)
        async with asyncio.timeout(self._send_timeout_s):
            await loop.sock_sendall(conn, result.reply.encode())
            for view in result.views:
                await loop.sock_sendall(conn, view)
        self.bytes_sent += result.reply.total_bytes
        self.blocks_sent += len(result.views)
