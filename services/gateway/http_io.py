"""The HTTP plumbing under the routes: bounded body reading, client disconnects, and the
middleware that counts every response. No API semantics here, and no framework: it speaks
ASGI and the few request methods it needs, typed below."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from services.gateway import errors
from services.gateway.errors import ApiError
from services.gateway.metrics import GatewayMetrics
from services.gateway.validation import decode_body
from shared.lifecycle import awaited_task

Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Request(Protocol):
    """What the plumbing uses of an HTTP request."""

    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def receive(self) -> Receive: ...
    def stream(self) -> AsyncIterator[bytes]: ...


M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
# A body over the limit is still read (not kept) up to this much, so the client sees the 413
# instead of a reset connection; anything bigger is cut off.
_DRAIN_LIMIT = 64 * 1024 * 1024
CLIENT_CLOSED = 499
DEBUG_REQUESTS = "/debug/requests/"
#: Bodies up to this size are decoded, validated, rendered and tokenized on the event loop (a
#: thread hop costs more than their parsing when the host is busy); larger ones in a worker
#: thread, so that one big body never stalls every other request.
INLINE_BODY_BYTES = 16 * 1024


def _validated(model: type[M], raw: bytes) -> M:
    # Strict: a bool or a string where a number belongs is refused, not converted.
    return model.model_validate(decode_body(raw), strict=True)


async def off_loop_above(size: int, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` on the loop for a body of at most ``INLINE_BODY_BYTES``, else in a
    worker thread."""
    if size <= INLINE_BODY_BYTES:
        return work(*args)
    return await asyncio.to_thread(work, *args)


async def parse_body(request: Request, model: type[M], limit: int) -> tuple[M, int]:
    raw = await read_body(request, limit)
    return await off_loop_above(len(raw), _validated, model, raw), len(raw)


async def read_json(request: Request, limit: int) -> tuple[dict[str, Any], int]:
    """The body's JSON object and its size in bytes; 413 over ``limit``, 400 if not JSON."""
    raw = await read_body(request, limit)
    return await off_loop_above(len(raw), decode_body, raw), len(raw)


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes; 413 over ``limit``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        await _drain(request)
        raise errors.too_large(limit)
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            await _drain(request, size)
            raise errors.too_large(limit)
        parts.append(part)
    return b"".join(parts)


async def _drain(request: Request, seen: int = 0) -> None:
    try:
        async for part in request.stream():
            seen += len(part)
            if seen > _DRAIN_LIMIT:
                return
    except Exception:  # the stream may already be consumed or gone; the 413 stands either way
        return


async def wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Awaits ``work``, cancelling it (which aborts its requests) if the client hangs up."""
    task = awaited_task(work, "request work")
    watcher = awaited_task(wait_for_disconnect(request), "disconnect watch")
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        raise ApiError(CLIENT_CLOSED, "The client closed the connection.")
    return task.result()


class CountRequests:
    """ASGI middleware counting every HTTP response by endpoint and status."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, endpoints: frozenset[str]) -> None:
        self.endpoints = endpoints
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        arrived = time.monotonic()

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                waited = time.monotonic() - arrived
                self.metrics.response_start.labels(str(status)).observe(waited)
            await send(message)

        path = scope.get("path", "")
        # Unknown paths share one label so that scanners cannot blow up the label set.
        endpoint = path if path in self.endpoints else "other"
        if path.startswith(DEBUG_REQUESTS):
            endpoint = DEBUG_REQUESTS  # one label for every request id
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.requests.labels(endpoint, str(status)).inc()
