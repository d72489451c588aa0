"""The gateway's span of each generation request: the root of the request's trace, from the
HTTP request's arrival to its last byte (a stream's end). What the gateway sends on the bus
while it is current carries its context (``shared.tracing.stamp``), and the request's log
lines its id, once it is submitted (``shared.logs.tagged``). A plain ASGI wrapper."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from shared import logs, tracing

TRACED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class TraceRequests:
    """Wraps the app; owns nothing."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in TRACED:
            await self.app(scope, receive, send)
            return
        name = f"{scope['method']} {scope['path']}"
        with logs.tagged(), tracing.span(name, attributes={"http.route": scope["path"]}):
            await self.app(scope, receive, send)
