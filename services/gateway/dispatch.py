"""The gateway's side of the bus: publish requests, receive their TokenChunks, abort leftovers.

The bus is passed in (``main`` hands over the connected ``shared.bus.Bus``); this module only
uses the calls the ``Bus`` protocol below names, so it stays free of NATS itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from services.gateway import errors
from shared import subjects
from shared.messages import AbortRequest, GenerateRequest, TokenChunk, WireMessage

log = logging.getLogger(__name__)
M = TypeVar("M", bound=WireMessage)


class Bus(Protocol):
    """What the dispatcher needs from the bus (``shared.bus.Bus`` in production)."""

    @property
    def connected(self) -> bool: ...

    async def publish(self, subject: str, message: WireMessage) -> None: ...

    async def subscribe(
        self, subject: str, kind: type[M], handler: Callable[[M], Awaitable[Any]], queue: str = ""
    ) -> Any: ...


class Flight:
    """The output stream of one API request's GenerateRequests, merged into one queue.

    Owns one subscription per request and the set of requests whose end (a finish or an error)
    the backend has sent. Invariant: ``close`` aborts every request that has not ended, exactly
    once, and a request is published only after its subscription exists.
    """

    def __init__(self, dispatcher: Dispatcher, request_ids: Sequence[str]) -> None:
        self._dispatcher = dispatcher
        self._ids = list(request_ids)
        self._ended: set[str] = set()
        self._aborted: set[str] = set()
        self._subscriptions: list[Any] = []
        self._queue: asyncio.Queue[TokenChunk] = asyncio.Queue()
        self._closed = False

    async def _on_chunk(self, request_id: str, chunk: TokenChunk) -> None:
        # The subject names the request; a chunk claiming another id must not be misrouted.
        chunk.request_id = request_id
        if chunk.finish_reason is not None or chunk.error is not None or chunk.error_code:
            self._ended.add(request_id)
        self._queue.put_nowait(chunk)

    async def send(self, requests: Sequence[GenerateRequest]) -> None:
        """Subscribes to every request's output, then publishes the requests."""
        for request in requests:
            subject = subjects.tokens(request.request_id)
            handler = functools.partial(self._on_chunk, request.request_id)
            subscription = await self._dispatcher.bus.subscribe(subject, TokenChunk, handler)
            self._subscriptions.append(subscription)
        # Subscriptions go out before the requests on the same connection, so the server
        # knows where to deliver the first token before anyone can produce it.
        for request in requests:
            await self._dispatcher.bus.publish(subjects.REQUESTS, request)

    async def next(self, timeout: float) -> TokenChunk:
        """The next chunk of any of the requests; ``TimeoutError`` after ``timeout`` seconds."""
        return await asyncio.wait_for(self._queue.get(), timeout=max(timeout, 0.0))

    def finish(self, request_id: str) -> None:
        """The gateway needs no more of ``request_id`` (a stop string matched): abort it now."""
        if request_id not in self._ended and request_id not in self._aborted:
            self._aborted.add(request_id)
            self._dispatcher.abort_soon([request_id], [])

    def close(self) -> None:
        """Aborts what is still running and drops the subscriptions. Safe to call twice and
        from a cancelled task: the work is handed to a task of its own."""
        if self._closed:
            return
        self._closed = True
        leftovers = [i for i in self._ids if i not in self._ended and i not in self._aborted]
        self._aborted.update(leftovers)
        self._dispatcher.abort_soon(leftovers, self._subscriptions)


class Dispatcher:
    """Sends GenerateRequests on the bus and hands back their output as ``Flight``s.

    Owns the bus client and the background tasks that publish aborts and unsubscribe, so a
    drain can wait for them. Invariant: a ``Flight`` it returns has every request published.
    """

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._cleanups: set[asyncio.Task[None]] = set()

    @property
    def connected(self) -> bool:
        return bool(self.bus.connected)

    async def open(self, requests: Sequence[GenerateRequest]) -> Flight:
        """Subscribes to the requests' outputs, then publishes them. 503 when the bus is down."""
        if not self.connected:
            raise errors.unavailable("The gateway is not connected to the message bus.")
        flight = Flight(self, [r.request_id for r in requests])
        try:
            await flight.send(requests)
        except BaseException as exc:
            # Cancelled or failed half-way: whatever went out must be aborted.
            flight.close()
            if not isinstance(exc, Exception):
                raise
            log.warning("publishing %d requests failed: %s", len(requests), exc)
            raise errors.unavailable("The message bus did not accept the request.") from exc
        return flight

    def abort_soon(self, request_ids: Sequence[str], subscriptions: Sequence[Any]) -> None:
        if not request_ids and not subscriptions:
            return
        task = asyncio.get_running_loop().create_task(self._cleanup(request_ids, subscriptions))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _cleanup(self, request_ids: Sequence[str], subscriptions: Sequence[Any]) -> None:
        for request_id in request_ids:
            try:
                await self.bus.publish(subjects.ABORTS, AbortRequest(request_id=request_id))
            except Exception as exc:
                log.warning("could not publish the abort of %s: %s", request_id, exc)
        for subscription in subscriptions:
            try:
                await subscription.unsubscribe()
            except Exception as exc:
                log.debug("unsubscribe failed: %s", exc)

    async def drain(self) -> None:
        """Waits for pending aborts, so that none is lost when the connection closes."""
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)
