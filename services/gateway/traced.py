"""The gateway's span of each generation request: the root of the request's trace, from the
HTTP request's arrival to its last byte (a stream's end). What the gateway sends on the bus
while it is current carries its context (``shared.tracing.stamp``). A plain ASGI wrapper that
passes everything through while tracing is off."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from shared import tracing

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
        if not tracing.enabled() or scope["type"] != "http" or scope["path"] not in TRACED:
            await self.app(scope, receive, send)
            return
        name = f"{scope['method']} {scope['path']}"
        with tracing.span(name, attributes={"http.route": scope["path"]}):
            await self.app(scope, receive, send)
