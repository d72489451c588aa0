"""The bus seam: what every service needs from NATS (``Bus``), and the NATS implementation.

``shared.memory_bus.MemoryBus`` implements the same protocol in one process, for fast tests.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec
import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from shared import tracing
from shared.errors import CrescentError
from shared.messages import WireMessage, decode, encode
from shared.nats_auth import check_identity
from shared.nats_events import NAME_PREFIX
from shared.tls import TlsSettings, from_env, url_host

log = logging.getLogger(__name__)
M = TypeVar("M", bound=WireMessage)
R = TypeVar("R", bound=WireMessage)
Handler = Callable[[M], Awaitable[Any]]
_MALFORMED = (msgspec.DecodeError, msgspec.ValidationError, ValueError)


class BusRequestError(CrescentError):
    """A request got no usable reply: nobody listens, it timed out, or the reply was malformed."""


class NoResponders(BusRequestError):
    """Nobody subscribes to the subject at all: the server said so at once."""


class Subscription(Protocol):
    async def unsubscribe(self) -> None: ...


class Bus(Protocol):
    """What services need from the bus. A malformed message, or a handler that raises, is
    logged and dropped: it never ends a subscription or the process."""

    @property
    def connected(self) -> bool: ...

    async def publish(self, subject: str, message: WireMessage) -> None: ...

    async def subscribe(
        self, subject: str, kind: type[M], handler: Handler[M], queue: str = ""
    ) -> Subscription:
        """Calls ``handler`` with every message on ``subject`` (a queue group shares them)."""
        ...

    async def watch(
        self, subject: str, kind: type[M], handler: Callable[[str, M], Awaitable[Any]]
    ) -> Subscription:
        """Like ``subscribe``, but the handler also gets the subject each message came on."""
        ...

    async def subscribe_raw(
        self, subject: str, handler: Callable[[bytes], Awaitable[Any]]
    ) -> Subscription:
        """Calls ``handler`` with the payload of every message on ``subject``: for messages
        that are not Crescent's (the NATS server's own advisories)."""
        ...

    async def request(
        self, subject: str, message: WireMessage, reply_kind: type[R], timeout_s: float
    ) -> R:
        """Sends ``message`` to one responder and returns its reply; ``NoResponders`` when
        nobody listens, ``BusRequestError`` on a timeout or a malformed reply."""
        ...

    async def serve(
        self,
        subject: str,
        kind: type[M],
        handler: Callable[[M], Awaitable[WireMessage | None]],
        queue: str = "",
    ) -> Subscription:
        """Answers requests on ``subject`` with what ``handler`` returns; None (or a failing
        handler, or a malformed request) sends no reply, so the requester times out."""
        ...

    def on_reconnect(self, callback: Callable[[], Awaitable[None]]) -> None:
        """``callback`` runs after every reconnection (messages may have been lost meanwhile)."""
        ...

    async def flush(self) -> None: ...

    async def close(self) -> None:
        """Delivers what is in flight, then disconnects."""
        ...


class NatsBus:
    """Owns the process's NATS connection (see ``Bus``). Reconnects forever on its own."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self._reconnect_callbacks: list[Callable[[], Awaitable[None]]] = []

    @classmethod
    async def connect(
        cls, url: str, name: str, *, tls: TlsSettings | None = None, **auth: Any
    ) -> NatsBus:
        """Connects as ``name`` (the connection name others see in disconnect events);
        ``auth`` holds the credentials (``shared.nats_auth``), passed to ``nats.connect``.
        ``tls`` (default: this process's environment, ``shared.tls``) says whether the
        connection is encrypted; ``PlaintextRefused`` when it would run in clear beyond
        loopback."""
        check_identity(name.removeprefix(NAME_PREFIX), str(auth.get("user", "")))
        bus: NatsBus | None = None
        auth |= tls_options(url, from_env() if tls is None else tls)

        async def reconnected() -> None:
            if bus is not None:
                await bus._reconnected()

        nc = await nats.connect(
            url,
            name=name,
            connect_timeout=5,
            reconnect_time_wait=0.5,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            reconnected_cb=reconnected,
            **auth,
        )
        bus = cls(nc)
        return bus

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def publish(self, subject: str, message: WireMessage) -> None:
        tracing.stamp(message)
        await self.nc.publish(subject, encode(message))

    async def subscribe(
        self, subject: str, kind: type[M], handler: Handler[M], queue: str = ""
    ) -> Subscription:
        async def deliver(message: M, msg: Msg) -> None:
            await handler(message)

        return await self._subscribe(subject, kind, deliver, queue)

    async def watch(
        self, subject: str, kind: type[M], handler: Callable[[str, M], Awaitable[Any]]
    ) -> Subscription:
        async def deliver(message: M, msg: Msg) -> None:
            await handler(msg.subject, message)

        return await self._subscribe(subject, kind, deliver, "")

    async def subscribe_raw(
        self, subject: str, handler: Callable[[bytes], Awaitable[Any]]
    ) -> Subscription:
        async def on_message(msg: Msg) -> None:
            try:
                await handler(msg.data)
            except Exception:
                log.exception("handler for %s failed", msg.subject)

        subscription: Subscription = await self.nc.subscribe(subject, cb=on_message)
        return subscription

    async def _subscribe(
        self,
        subject: str,
        kind: type[M],
        handler: Callable[[M, Msg], Awaitable[None]],
        queue: str,
    ) -> Subscription:
        async def on_message(msg: Msg) -> None:
            try:
                message = decode(msg.data, kind)
            except _MALFORMED as exc:
                log.warning("dropped a malformed %s on %s: %s", kind.__name__, msg.subject, exc)
                return
            try:
                with tracing.delivery(message, msg.subject):
                    await handler(message, msg)
            except Exception:
                log.exception("handler for %s failed", msg.subject)

        subscription: Subscription = await self.nc.subscribe(subject, queue=queue, cb=on_message)
        return subscription

    async def request(
        self, subject: str, message: WireMessage, reply_kind: type[R], timeout_s: float
    ) -> R:
        tracing.stamp(message)
        try:
            reply = await self.nc.request(subject, encode(message), timeout=timeout_s)
            return decode(reply.data, reply_kind)
        except nats.errors.NoRespondersError as exc:
            raise NoResponders(f"nobody answers on {subject}") from exc
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusRequestError(f"no reply on {subject}: {exc!r}") from exc
        except _MALFORMED as exc:
            raise BusRequestError(f"malformed reply on {subject}: {exc}") from exc

    async def serve(
        self,
        subject: str,
        kind: type[M],
        handler: Callable[[M], Awaitable[WireMessage | None]],
        queue: str = "",
    ) -> Subscription:
        async def respond(message: M, msg: Msg) -> None:
            reply = await handler(message)
            if reply is not None and msg.reply:
                await msg.respond(encode(reply))

        return await self._subscribe(subject, kind, respond, queue)

    def on_reconnect(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._reconnect_callbacks.append(callback)

    async def _reconnected(self) -> None:
        log.info("reconnected to NATS")
        for callback in self._reconnect_callbacks:
            try:
                await callback()
            except Exception:
                log.exception("reconnect callback failed")

    async def flush(self) -> None:
        await self.nc.flush()

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        try:
            await self.nc.drain()
        except nats.errors.Error as exc:
            # NATS is already gone (e.g. stopped first): nothing is left to deliver.
            log.info("bus closed without draining: %r", exc)
            await self.nc.close()


def tls_options(url: str, tls: TlsSettings) -> dict[str, Any]:
    """Keyword arguments of ``nats.connect`` for TLS to ``url``: the client's context, and a
    handshake before anything else (the servers Crescent configures expect it,
    ``crescent.nats_tls``); nothing for a connection in clear."""
    context = tls.client_context("the NATS connection", url_host(url))
    if context is None:
        return {}
    options: dict[str, Any] = {"tls": context, "tls_handshake_first": True}
    if tls.tls_server_name:
        options["tls_hostname"] = tls.tls_server_name
    return options
