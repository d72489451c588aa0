"""The TCP pulling client: one connection per pull in flight, reused from a per-peer pool, in
clear or over mutual TLS (``shared.tls``, ``tcp_channel``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import ssl
import time
from collections.abc import Sequence

from shared.tls import PlaintextRefused, TlsSettings, from_env
from shared.transfer.base import DEFAULT_TIMEOUT_S, BufferLike, TransferError
from shared.transfer.tcp import LINK, decode_address, recv_exactly
from shared.transfer.tcp_channel import Channel, PlainChannel, TlsChannel
from shared.transfer.wire import (
    REPLY_HEAD_BYTES,
    PullRequest,
    Reply,
    Status,
    check_pull,
    decode_reply,
    reply_message_bytes,
)

# Idle connections kept per peer; more concurrent pulls than this open extra ones that are
# closed afterwards, so a burst does not leave sockets behind for good.
MAX_IDLE_PER_PEER = 4
# How long an unused connection is kept: well below the server's idle timeout
# (``tcp.DEFAULT_IDLE_TIMEOUT_S``), so the server does not close one as a pull starts on it.
MAX_IDLE_S = 30.0
# A connection idle longer than this is checked for a close by the server before reuse (a
# system call); one reused at once is not.
CHECK_AFTER_S = 0.05


class TcpTransferClient:
    """Pulls blocks over TCP, one connection per pull in flight, reused from a per-peer pool.

    Owns every socket it opened. Invariant: a pooled connection sits exactly between two pulls
    (nothing left unread), so a pull that fails mid-stream closes its connection instead; one
    idle past ``max_idle_s``, or closed by the server, is closed rather than reused. With TLS
    on, no request leaves before the server's certificate has been verified.
    """

    def __init__(
        self,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_idle_s: float = MAX_IDLE_S,
        tls: TlsSettings | None = None,
    ) -> None:
        """``tls``: default this process's environment (``shared.tls``)."""
        self._tls = from_env() if tls is None else tls
        self._context: ssl.SSLContext | None = (
            self._tls.client_context(LINK, "") if self._tls.enabled else None
        )
        self._clear_peers: set[str] = set()  # hosts checked for pulls in clear
        self._timeout_s = timeout_s
        self._max_idle_s = max_idle_s
        # One connection per pull in flight rather than one locked connection per peer: a
        # stream carries one reply at a time, so a lock would queue a small pull behind a large
        # one, and a pull that times out mid-stream would take the shared connection with it.
        self._idle: dict[tuple[str, int], list[tuple[Channel, float]]] = {}
        self._open: set[socket.socket] = set()
        self._ids = itertools.count(1)
        self.bytes_received = 0
        self.blocks_received = 0

    async def pull(
        self,
        address: bytes,
        lease_id: str,
        block_ids: Sequence[int],
        dest: Sequence[BufferLike],
        timeout_s: float | None = None,
    ) -> int:
        views = check_pull(lease_id, block_ids, dest)
        peer = decode_address(address)
        self._check_clear(peer[0])
        request = PullRequest(
            next(self._ids), lease_id, tuple(block_ids), tuple(v.nbytes for v in views)
        )
        timeout = self._timeout_s if timeout_s is None else timeout_s
        where = f"pull of {len(views)} blocks of lease {lease_id!r} from {peer[0]}:{peer[1]}"
        channel: Channel | None = None
        reply: Reply | None = None
        try:
            async with asyncio.timeout(timeout):
                channel = self._take_idle(peer) or await self._connect(peer)
                reply = await self._exchange(channel, request, views)
        except TimeoutError:
            raise TransferError(f"{where} timed out after {timeout:g} s") from None
        except ssl.SSLError as exc:
            raise TransferError(f"{where} failed: TLS refused ({exc})") from exc
        except OSError as exc:
            raise TransferError(f"{where} failed: peer gone ({exc})") from exc
        except ValueError as exc:
            raise TransferError(f"{where} failed: malformed reply ({exc})") from exc
        finally:
            # Without a whole reply the stream stopped mid-message and cannot carry another.
            if channel is not None and reply is not None and reply.status != Status.BAD_REQUEST:
                self._put_idle(peer, channel)
            elif channel is not None:
                self._discard(channel.sock)
        assert reply is not None  # the try block either set it or raised
        reply.raise_for_status(where)
        self.bytes_received += reply.total_bytes
        self.blocks_received += len(views)
        return reply.total_bytes

    async def close(self) -> None:
        for sock in list(self._open):
            self._discard(sock)
        self._idle.clear()

    def _check_clear(self, host: str) -> None:
        if self._context is not None or host in self._clear_peers:
            return
        try:
            self._tls.check_clear(LINK, host)
        except PlaintextRefused as exc:
            raise TransferError(str(exc)) from exc
        self._clear_peers.add(host)

    async def _exchange(
        self, channel: Channel, request: PullRequest, views: list[memoryview]
    ) -> Reply:
        await channel.sendall(request.encode())
        head = memoryview(bytearray(REPLY_HEAD_BYTES))
        await recv_exactly(channel, head)
        text = memoryview(bytearray(reply_message_bytes(head)))
        await recv_exactly(channel, text)
        reply = decode_reply(bytes(head) + bytes(text))
        if reply.request_id != request.request_id and reply.status != Status.BAD_REQUEST:
            raise ValueError(f"reply to request {reply.request_id}, not {request.request_id}")
        if reply.status == Status.OK:
            for view in views:
                await recv_exactly(channel, view)
        return reply

    async def _connect(self, peer: tuple[str, int]) -> Channel:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(peer[0], peer[1], type=socket.SOCK_STREAM)
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        self._open.add(sock)
        try:
            await loop.sock_connect(sock, sockaddr)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is None:
                return PlainChannel(sock)
            name = self._tls.tls_server_name or peer[0]
            channel = TlsChannel(sock, self._context, server_side=False, server_hostname=name)
            await channel.handshake()
            return channel
        except BaseException:
            self._discard(sock)
            raise

    def _take_idle(self, peer: tuple[str, int]) -> Channel | None:
        idle = self._idle.get(peer)
        now = time.monotonic()
        while idle:  # the newest first
            channel, since = idle.pop()
            # Back-to-back pulls skip the check: only a connection left idle for a while may
            # have been closed by the server (its idle timeout, or making room for another).
            fresh = now - since < CHECK_AFTER_S
            if fresh or (now - since < self._max_idle_s and _in_step(channel)):
                return channel
            self._discard(channel.sock)
        return None

    def _put_idle(self, peer: tuple[str, int], channel: Channel) -> None:
        idle = self._idle.setdefault(peer, [])
        now = time.monotonic()
        if idle and now - idle[0][1] > self._max_idle_s:
            self._discard(idle.pop(0)[0].sock)  # the oldest, unused for too long
        if len(idle) < MAX_IDLE_PER_PEER and channel.sock in self._open:
            idle.append((channel, now))
        else:
            self._discard(channel.sock)

    def _discard(self, sock: socket.socket) -> None:
        self._open.discard(sock)
        with contextlib.suppress(OSError):
            sock.close()


def _in_step(channel: Channel) -> bool:
    """Whether an idle connection can carry a pull: the server has not closed it (nor sent
    anything, which on an idle connection would be out of step with the protocol)."""
    if channel.buffered():
        return False
    try:
        channel.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True  # nothing to read: still open, and in step
    except OSError:
        return False
    return False
