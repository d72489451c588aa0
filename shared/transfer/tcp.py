"""Block pulls over TCP: the fallback transport, and the one for hosts without UCX.

Both ends use raw non-blocking sockets on the event loop rather than asyncio streams: the client
(``tcp_client``) receives each block straight into its destination with ``sock_recv_into``
(streams would copy every byte once more and run at about half the speed), and the server here
sends from the provider's buffers with ``sock_sendall`` without staging them. With TLS on
(``shared.tls``) both ends run mutual TLS over those sockets (``tcp_channel``): blocks are
decrypted straight into their destination, and only peers holding a certificate of the
deployment's CA get a connection's first request read.

The server guards itself against clients that misbehave or vanish: a request must arrive whole
within ``read_timeout_s`` of its first byte, a connection may idle between pulls for
``idle_timeout_s``, and at most ``max_connections`` are open at once. A connection over the cap
takes the place of the one idle the longest, or is closed unread when none is idle. What a
request makes the server allocate is bounded by the protocol's limits (``wire``), whatever
sizes it announces: the blocks are the provider's, never buffers sized by the client.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl

from shared.lifecycle import Lifecycle
from shared.tls import TlsSettings, from_env
from shared.transfer.base import (
    DEFAULT_SEND_TIMEOUT_S,
    BlockProvider,
    TransferError,
)
from shared.transfer.tcp_channel import SERVER_RECV_BYTES, Channel, PlainChannel, TlsChannel
from shared.transfer.tcp_deadlines import Deadlines
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

LINK = "the KV transfer port"
ADDRESS_PREFIX = b"tcp:"
_WILDCARDS = ("", "0.0.0.0", "::")
DEFAULT_READ_TIMEOUT_S = 10.0
# Longer than a client keeps an unused connection (``tcp_client.MAX_IDLE_S``), so a healthy
# client lets go of it first.
DEFAULT_IDLE_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 256
_REFUSED_LOG_EVERY = 1000


class PeerClosedError(ConnectionError):
    """The other end closed the connection in the middle of a message."""


async def recv_exactly(channel: Channel, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = await channel.recv_into(view[got:])
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

    Owns the listening socket and a lifecycle that runs the accepting and sweeping tasks and
    one task per connection, which alone closes its socket. Invariants: a connection carries
    one pull at a time, in order, so replies never interleave; at most ``max_connections`` are
    served at once; with TLS on, no request is read before the client's certificate has been
    verified.
    """

    def __init__(
        self,
        provider: BlockProvider,
        host: str = "127.0.0.1",
        *,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls: TlsSettings | None = None,
    ) -> None:
        """``tls``: default this process's environment (``shared.tls``)."""
        self._provider = provider
        self._tls = from_env() if tls is None else tls
        self._context: ssl.SSLContext | None = None
        self._host = host
        self._send_timeout_s = send_timeout_s
        self._max_connections = max_connections
        self._sock: socket.socket | None = None
        self._address = b""
        self._life = Lifecycle("tcp transfer server")
        self._conns: dict[socket.socket, asyncio.Task[None]] = {}
        self._deadlines = Deadlines(idle_timeout_s, read_timeout_s)
        self.bytes_sent = 0
        self.blocks_sent = 0
        self.connections_refused = 0

    @property
    def address(self) -> bytes:
        if not self._address:
            raise TransferError("the TCP transfer server is not started")
        return self._address

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return len(self._conns)

    async def start(self) -> None:
        """Listens; ``PlaintextRefused`` when it would serve in clear beyond loopback."""
        self._context = self._tls.server_context(LINK, self._host)
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
        life = self._life
        # A failed accept (out of descriptors, say) is logged and retried after a backoff.
        life.run("accept", functools.partial(self._accept_loop, sock))
        life.every("sweep", self._deadlines.tick_s, self._sweep, immediately=False)
        # A step, so it runs after the tasks: each takes its socket off the loop before
        # closing it, and no descriptor is closed while the loop still watches it.
        life.on_stop("listening socket", self._close_socket)
        await life.start()

    async def close(self) -> None:
        await self._life.stop()

    def _close_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            if len(self._conns) >= self._max_connections and not self._evict_idle():
                conn.close()  # unread: a flood costs an accept and a close per connection
                self._count_refused()
                continue
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._life.spawn(self._serve(conn), "serve")
            self._conns[conn] = task
            task.add_done_callback(functools.partial(self._forget, conn))

    def _forget(self, conn: socket.socket, _: asyncio.Task[None]) -> None:
        self._conns.pop(conn, None)  # already gone when evicted

    def _evict_idle(self) -> bool:
        """Make room by dropping the connection idle the longest; False when none is idle."""
        conn = self._deadlines.longest_idle()
        if conn is None:
            return False
        self._deadlines.done(conn)
        self._conns.pop(conn).cancel()  # its task closes the socket
        return True

    async def _sweep(self) -> None:
        """Drops the connections that idled or read past their deadlines."""
        idle, reading = self._deadlines.expired()
        for conn in idle + reading:
            task = self._conns.get(conn)
            if task is not None:
                task.cancel()  # its task closes the socket
        if reading:
            log.info("dropped %d transfer connections slow to send a request", len(reading))

    def _count_refused(self) -> None:
        self.connections_refused += 1
        if self.connections_refused % _REFUSED_LOG_EVERY == 1:
            log.warning(
                "transfer server at its cap of %d connections: refused %d so far",
                self._max_connections,
                self.connections_refused,
            )

    async def _serve(self, conn: socket.socket) -> None:
        head = memoryview(bytearray(REQUEST_HEAD_BYTES))
        try:
            channel = await self._open_channel(conn)
            while (request := await self._read_request(channel, head)) is not None:
                await self._send_answer(channel, request)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError included: a refused peer
            log.info("transfer connection dropped: %r", exc)
        finally:
            self._deadlines.done(conn)
            conn.close()

    async def _open_channel(self, conn: socket.socket) -> Channel:
        if self._context is None:
            return PlainChannel(conn)
        # The handshake is held to the read deadline: a client that connects and never
        # completes it frees its slot as one that trickles a request does.
        self._deadlines.request_started(conn)
        channel = TlsChannel(conn, self._context, server_side=True, recv_bytes=SERVER_RECV_BYTES)
        await channel.handshake()
        self._deadlines.done(conn)
        return channel

    async def _read_request(self, channel: Channel, head: memoryview) -> PullRequest | None:
        """The next request on ``channel``; None when the connection is to end quietly."""
        deadlines, conn = self._deadlines, channel.sock
        deadlines.wait_for_request(conn)
        got = await channel.recv_into(head)
        if got == 0:
            return None  # the client hung up between pulls
        # One deadline for the rest of the request, however it trickles in.
        deadlines.request_started(conn)
        await recv_exactly(channel, head[got:])
        try:
            body = memoryview(bytearray(request_body_bytes(head)))
            await recv_exactly(channel, body)
            request = decode_request(bytes(head) + bytes(body))
        except ValueError as exc:
            deadlines.done(conn)
            await self._refuse(channel, exc)
            return None
        deadlines.done(conn)
        return request

    async def _refuse(self, channel: Channel, exc: ValueError) -> None:
        # The stream cannot be trusted past a bad request: answer, then hang up.
        reply = Reply(0, Status.BAD_REQUEST, 0, str(exc)).encode()
        async with asyncio.timeout(self._send_timeout_s):
            await channel.sendall(reply)

    async def _send_answer(self, channel: Channel, request: PullRequest) -> None:
        result = answer(self._provider, request)
        async with asyncio.timeout(self._send_timeout_s):
            await channel.sendall(result.reply.encode())
            for view in result.views:
                await channel.sendall(view)
        self.bytes_sent += result.reply.total_bytes
        self.blocks_sent += len(result.views)
