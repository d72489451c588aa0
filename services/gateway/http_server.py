"""uvicorn as the gateway runs it: its httptools protocol with the deadlines uvicorn lacks (a
whole header block, a whole body) and a cap on open connections, plus the ``uvicorn.Config``
that ``main`` and the test fixtures both build from the settings."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a client may take over each part of a request, and how many connections the
    gateway holds open at once."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 5.0
    max_connections: int = 1000


def _reply(status_line: bytes, text: bytes) -> bytes:
    """A complete response that closes the connection, written where no ASGI app is running."""
    head = (
        b"HTTP/1.1 " + status_line + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: " + str(len(text)).encode() + b"\r\nconnection: close\r\n\r\n"
    )
    return head + text


_BUSY = _reply(b"503 Service Unavailable", b"Too many open connections.")
_SLOW_BODY = _reply(b"408 Request Timeout", b"The request body did not arrive in time.")


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with deadlines: a connection must deliver each request's
    header block within ``header_timeout_s`` of its first byte (or of the connection opening)
    and its body within ``body_timeout_s`` of the headers; between requests it may sit idle
    ``idle_timeout_s``. Connections beyond ``max_connections`` get a 503 and are closed.

    Invariant: at most one deadline timer is armed per connection, and none once it is lost.
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.idle_timeout_s  # type: ignore[assignment]
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            # Refused before any request: holding it would let idle sockets crowd out clients.
            self.transport.write(_BUSY)
            self.transport.close()
            return
        # A connection that sends nothing at all is timed like a slow header block.
        self._arm(self.limits.header_timeout_s, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:
            self._arm(self.limits.header_timeout_s, self._headers_late)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        # The parser calls on_message_complete at once for a request without a body.
        self._arm(self.limits.body_timeout_s, self._body_late)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, delay_s: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def _body_late(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if self.transport.is_closing():
            return
        if cycle is not None and not cycle.response_started:
            self.transport.write(_SLOW_BODY)
        if cycle is not None:
            # The app waiting on the body is told the client is gone, and writes nothing more.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpTools]:
    """The protocol class with ``limits``: uvicorn builds one instance per connection from a
    class, so the limits travel as a class attribute of a subclass of their own."""
    return type("GatewayHttpProtocol", (GuardedHttpTools,), {"limits": limits})


def server_config(
    app: Any, host: str, port: int, limits: ConnectionLimits, **extra: Any
) -> uvicorn.Config:
    """The ``uvicorn.Config`` of a gateway serving ``app``; ``extra`` adds uvicorn options."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        log_config=None,
        http=guarded_protocol(limits),
        timeout_keep_alive=max(1, round(limits.idle_timeout_s)),
        **extra,
    )
