"""``/docs`` and ``/redoc`` without the network: Swagger UI and ReDoc come from the files
``fastapi-offline`` installs (``api.build_app``), and both pages carry a
Content-Security-Policy that lets them load nothing from another origin. ReDoc 2 shows
Redocly's logo from Redocly's CDN in its sidebar, with no option to leave it out; the policy
keeps the browser from asking for it. A plain ASGI wrapper."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

DOCS_PAGES = frozenset({"/docs", "/redoc"})
#: FastAPI's pages start their UI from inline scripts and style it inline; ReDoc's search runs
#: in a worker made from a blob.
POLICY = (
    b"default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    b"img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class OfflineDocs:
    """Wraps the app; owns nothing."""

    def __init__(self, app: App) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in DOCS_PAGES:
            await self.app(scope, receive, send)
            return

        async def with_policy(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                message["headers"] = [*headers, (b"content-security-policy", POLICY)]
            await send(message)

        await self.app(scope, receive, with_policy)
