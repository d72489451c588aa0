"""The NATS seam: one connection per process, typed messages in and out."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.messages import WireMessage, decode, encode

log = logging.getLogger(__name__)
M = TypeVar("M", bound=WireMessage)


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
        async def on_message(msg: Msg) -> None:
            try:
                message = decode(msg.data, kind)
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                log.warning("dropped a malformed %s on %s: %s", kind.__name__, msg.subject, exc)
                return
            try:
                await handler(message)
            except Exception:
                log.exception("handler for %s failed", msg.subject)

        return await self.nc.subscribe(subject, queue=queue, cb=on_message)

    async def flush(self) -> None:
        await self.nc.flush()

    async def close(self) -> None:
        """Delivers what is in flight, then disconnects."""
        if not self.nc.is_closed:
            await self.nc.drain()
