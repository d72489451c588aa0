"""The NATS seam: one connection per process, typed messages in and out."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.errors import CrescentError
from shared.messages import WireMessage, decode, encode

log = logging.getLogger(__name__)
M = TypeVar("M", bound=WireMessage)
R = TypeVar("R", bound=WireMessage)


class BusRequestError(CrescentError):
    """A request got no usable reply: nobody listens, it timed out, or the reply was malformed."""


class Bus:
    """Owns the process's NATS connection. A malformed message, or a handler that raises, is
    logged and dropped: it never ends a subscription or the process."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc

    @classmethod
    async def connect(cls, url: str, name: str) -> Bus:
        nc = await nats.connect(
            url,
            name=name,
            connect_timeout=5,
            reconnect_time_wait=0.5,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
        )
        return cls(nc)

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    async def publish(self, subject: str, message: WireMessage) -> None:
        await self.nc.publish(subject, encode(message))

    async def subscribe(
        self,
        subject: str,
        kind: type[M],
        handler: Callable[[M], Awaitable[Any]],
        queue: str = "",
    ) -> Subscription:
        async def deliver(message: M, msg: Msg) -> None:
            await handler(message)

        return await self._subscribe(subject, kind, deliver, queue)

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
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                log.warning("dropped a malformed %s on %s: %s", kind.__name__, msg.subject, exc)
                return
            try:
                await handler(message, msg)
            except Exception:
                log.exception("handler for %s failed", msg.subject)

        return await self.nc.subscribe(subject, queue=queue, cb=on_message)

    async def request(
        self, subject: str, message: WireMessage, reply_kind: type[R], timeout_s: float
    ) -> R:
        """Sends ``message`` to one responder on ``subject`` and returns its reply."""
        try:
            reply = await self.nc.request(subject, encode(message), timeout=timeout_s)
            return decode(reply.data, reply_kind)
        except (nats.errors.Error, TimeoutError) as exc:
            raise BusRequestError(f"no reply on {subject}: {exc!r}") from exc
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise BusRequestError(f"malformed reply on {subject}: {exc}") from exc

    async def serve(
        self,
        subject: str,
        kind: type[M],
        handler: Callable[[M], Awaitable[WireMessage | None]],
    ) -> Subscription:
        """Answers requests on ``subject`` with what ``handler`` returns; None (or a failing
        handler, or a malformed request) sends no reply, so the requester times out."""

        async def respond(message: M, msg: Msg) -> None:
            reply = await handler(message)
            if reply is not None and msg.reply:
                await msg.respond(encode(reply))

        return await self._subscribe(subject, kind, respond, "")

    async def flush(self) -> None:
        await self.nc.flush()

    async def close(self) -> None:
        """Delivers what is in flight, then disconnects."""
        if self.nc.is_closed:
            return
        try:
            await self.nc.drain()
        except nats.errors.Error as exc:
            # NATS is already gone (e.g. stopped first): nothing is left to deliver.
            log.info("bus closed without draining: %r", exc)
            await self.nc.close()
