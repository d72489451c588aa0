"""The byte streams of TCP pulls: a socket in clear, or TLS over the same non-blocking socket.

TLS runs in memory (``ssl.MemoryBIO``) on the event loop's raw socket calls rather than through
asyncio streams: records are decrypted straight into the caller's buffer (a pull's destination
block), so TLS adds the cipher's work and one copy of the ciphertext, not the two extra copies
and the buffering of a stream. Both kinds offer the same three calls, so the server and the
client have one code path.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from typing import Protocol, cast

# Ciphertext read from the socket at once by a pulling client: many TLS records (16 KiB each)
# per system call. A server reads only requests, and keeps less per connection.
RECV_BYTES = 256 * 1024
SERVER_RECV_BYTES = 32 * 1024
# Plaintext encrypted per send: bounds the ciphertext held in memory for a long reply.
SEND_BYTES = 256 * 1024


class Channel(Protocol):
    """One connection's bytes, in order. Owns nothing: the socket's owner closes it."""

    @property
    def sock(self) -> socket.socket: ...

    async def recv_into(self, view: memoryview) -> int:
        """Fills the start of ``view`` with what has arrived; 0 when the peer closed."""
        ...

    async def sendall(self, data: bytes | memoryview) -> None: ...

    def buffered(self) -> bool:
        """Whether bytes have arrived that nobody has read yet."""
        ...


class PlainChannel:
    """The socket itself, in clear. Invariant: it never buffers."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()

    @property
    def sock(self) -> socket.socket:
        return self._sock

    async def recv_into(self, view: memoryview) -> int:
        return await self._loop.sock_recv_into(self._sock, view)

    async def sendall(self, data: bytes | memoryview) -> None:
        await self._loop.sock_sendall(self._sock, data)

    def buffered(self) -> bool:
        return False


class TlsChannel:
    """TLS over a non-blocking socket, driven by hand through memory buffers.

    Owns the TLS state and its two buffers. Invariant: ciphertext the TLS state produced is
    written to the socket before the channel waits to read, so a peer is never left waiting
    for a handshake message or a reply this side still holds.
    """

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
        recv_bytes: int = RECV_BYTES,
    ) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming,
            self._outgoing,
            server_side=server_side,
            server_hostname=server_hostname,
        )
        self._buffer = bytearray(recv_bytes)
        self._closed = False

    @property
    def sock(self) -> socket.socket:
        return self._sock

    async def handshake(self) -> None:
        """Completes the handshake; ``ssl.SSLError`` when a certificate is refused, either way,
        and ``ConnectionError`` when the peer hangs up first."""
        while not await self._handshake_step():
            await self._flush()
            if not await self._fill():
                raise ConnectionError("the peer closed the connection during the handshake")
        await self._flush()

    async def _handshake_step(self) -> bool:
        """Advances the handshake with what has arrived; True once it is complete."""
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError:
            # The alert saying why goes out first, so the peer's error names the reason.
            with contextlib.suppress(OSError):
                await self._flush()
            raise
        return True

    async def recv_into(self, view: memoryview) -> int:
        while True:
            try:
                got = self._read(view)
            except ssl.SSLWantReadError:
                if self._closed:
                    return 0
                await self._flush()
                await self._fill()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                # The peer closed, with or without saying so: the pull protocol's own lengths
                # tell a connection cut short mid-message from one closed between messages.
                return 0
            return got

    def _read(self, view: memoryview) -> int:
        # Given a buffer, read() fills it and returns a count (typeshed says bytes).
        return cast(int, self._tls.read(len(view), view))

    async def sendall(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), SEND_BYTES):
            self._tls.write(view[start : start + SEND_BYTES])
            await self._flush()

    def buffered(self) -> bool:
        return self._incoming.pending > 0 or self._tls.pending() > 0

    async def _flush(self) -> None:
        if self._outgoing.pending:
            await self._loop.sock_sendall(self._sock, self._outgoing.read())

    async def _fill(self) -> bool:
        """Reads what the socket has into the TLS state; False when the peer has closed."""
        view = memoryview(self._buffer)
        n = await self._loop.sock_recv_into(self._sock, view)
        if n == 0:
            self._closed = True
            self._incoming.write_eof()
            return False
        self._incoming.write(view[:n])
        return True
