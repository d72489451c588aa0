"""The HTTP adapter: FastAPI routes that translate between OpenAI's API and the gateway core."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway import errors
from services.gateway.auth import ApiKeys
from services.gateway.completions import Completions
from services.gateway.errors import ApiError
from services.gateway.metrics import GatewayMetrics
from services.gateway.phases import Recent
from services.gateway.requests import PreparedRequest, RequestBuilder
from services.gateway.responses import Shapes
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest
from services.gateway.service import Run
from services.gateway.validation import decode_body
from shared import phases

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
B = TypeVar("B", ChatCompletionRequest, CompletionRequest)
ENDPOINTS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/health",
        "/healthz",
        "/readyz",
        "/livez",
        "/metrics",
    }
)
DEBUG_REQUESTS = "/debug/requests/"
# A body over the limit is still read (not kept) up to this much, so the client sees the 413
# instead of a reset connection; anything bigger is cut off.
_DRAIN_LIMIT = 64 * 1024 * 1024
CLIENT_CLOSED = 499
#: Bodies up to this size are rendered and tokenized on the event loop (``_prepare``).
INLINE_BODY_BYTES = 16 * 1024


@dataclass(frozen=True, slots=True)
class Gateway:
    """Everything the routes use, built once by ``main``."""

    builder: RequestBuilder
    completions: Completions
    keys: ApiKeys
    metrics: GatewayMetrics
    max_request_bytes: int
    created: int
    recent: Recent = field(default_factory=Recent)


def build_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="Crescent gateway", version="0.1.0")
    app.state.gateway = gateway
    _install_error_handlers(app)
    app.add_middleware(_CountRequests, metrics=gateway.metrics)
    _add_routes(app, gateway)
    return app


def _error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def fastapi_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(errors.from_validation(list(exc.errors())))

    @app.exception_handler(ValidationError)
    async def body_validation(_: Request, exc: ValidationError) -> JSONResponse:
        return _error_response(errors.from_validation(list(exc.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return _error_response(errors.route_not_found(request.method, request.url.path))
        return _error_response(ApiError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def crash(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return _error_response(errors.internal())


def _add_routes(app: FastAPI, gw: Gateway) -> None:
    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        arrived = time.monotonic()
        tenant = gw.keys.tenant(request.headers.get("authorization"))
        body, size = await _parse(request, ChatCompletionRequest, gw.max_request_bytes)
        prepared = await _prepare(gw.builder.chat, body, tenant, size)
        return await _generate(request, gw, prepared, arrived)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        arrived = time.monotonic()
        tenant = gw.keys.tenant(request.headers.get("authorization"))
        body, size = await _parse(request, CompletionRequest, gw.max_request_bytes)
        prepared = await _prepare(gw.builder.completion, body, tenant, size)
        return await _generate(request, gw, prepared, arrived)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        gw.keys.tenant(request.headers.get("authorization"))
        return {"object": "list", "data": [_model_card(gw)]}

    @app.get("/v1/models/{name:path}")
    async def model(request: Request, name: str) -> dict[str, Any]:
        gw.keys.tenant(request.headers.get("authorization"))
        if name != gw.builder.model_name:
            raise errors.model_not_found(name)
        return _model_card(gw)

    @app.get("/health")
    @app.get("/readyz")
    async def ready() -> JSONResponse:
        # Readiness: requests can be served now (a scheduler and both node roles are live).
        ok, reason = gw.completions.dispatcher.readiness()
        if ok:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable", "reason": reason}, 503)

    @app.get("/healthz")
    @app.get("/livez")
    async def live() -> JSONResponse:
        # Liveness: the process serves HTTP; restarting it would not help the cluster.
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(gw.metrics.render(), media_type=gw.metrics.content_type)

    @app.get(DEBUG_REQUESTS + "{request_id}")
    async def request_phases(request: Request, request_id: str) -> dict[str, Any]:
        # Where one recent request's time went (the response's id); its tenant's alone.
        tenant = gw.keys.tenant(request.headers.get("authorization"))
        found = gw.recent.get(request_id, tenant)
        if found is None:
            raise errors.request_not_found(request_id)
        return found


def _model_card(gw: Gateway) -> dict[str, Any]:
    return {
        "id": gw.builder.model_name,
        "object": "model",
        "created": gw.created,
        "owned_by": "crescent",
        "max_model_len": gw.builder.max_model_len,
    }


async def _prepare(
    build: Callable[[B, str], PreparedRequest], body: B, tenant: str, size: int
) -> PreparedRequest:
    """Renders and tokenizes on the loop for small bodies (a thread hop costs more than their
    tokenizing when the host is busy), in a worker thread for large ones."""
    if size <= INLINE_BODY_BYTES:
        return build(body, tenant)
    return await run_in_threadpool(build, body, tenant)


async def _parse(request: Request, model: type[M], limit: int) -> tuple[M, int]:
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
    data = decode_body(b"".join(parts))
    # Strict: a bool or a string where a number belongs is refused, not converted.
    return model.model_validate(data, strict=True), size


async def _drain(request: Request, seen: int = 0) -> None:
    try:
        async for part in request.stream():
            seen += len(part)
            if seen > _DRAIN_LIMIT:
                return
    except Exception:  # the stream may already be consumed or gone; the 413 stands either way
        return


async def _generate(
    request: Request, gw: Gateway, prepared: PreparedRequest, arrived: float
) -> Response:
    gw.metrics.in_flight.inc()
    try:
        run = await _unless_disconnected(request, gw.completions.start(prepared))
    except BaseException:
        gw.metrics.in_flight.dec()
        raise
    run.phases.gateway(phases.PARSE, run.timing.start - arrived)
    shapes = Shapes(prepared, gw.completions.tokenizer)
    if prepared.stream:
        return _RunStream(run, shapes, gw)
    try:
        await _unless_disconnected(request, run.collect())
        return JSONResponse(shapes.response(run.choices))
    finally:
        _finish(run, gw)


def _finish(run: Run, gw: Gateway) -> None:
    run.close()
    view = run.debug_view()
    gw.recent.add(run.request.id, run.request.choices[0].request.tenant, view)
    gw.metrics.observe_run(run, view["phases_s"])
    gw.metrics.in_flight.dec()


def _event(payload: dict[str, Any]) -> bytes:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


async def _sse(run: Run, shapes: Shapes) -> AsyncIterator[bytes]:
    for opening in shapes.role_chunks():
        yield _event(opening)
    try:
        async for index, delta in run.deltas():
            for chunk in shapes.delta_chunks(index, delta):
                writing = time.monotonic()
                yield _event(chunk)  # back here once the server has sent it on
                run.phases.wrote_event(time.monotonic() - writing)
        if run.request.include_usage:
            yield _event(shapes.usage_chunk(run.choices))
    except ApiError as exc:
        # The status line is gone already; OpenAI clients raise on an error event.
        yield _event(exc.body())
    except Exception:
        log.exception("stream of %s failed", run.request.id)
        yield _event(errors.internal().body())
    yield b"data: [DONE]\n\n"


class _RunStream(StreamingResponse):
    """An SSE response that owns its run: whatever ends the response (the last event, an
    error, or the client hanging up, even before the first byte) closes the run and aborts
    what still generates."""

    def __init__(self, run: Run, shapes: Shapes, gw: Gateway) -> None:
        super().__init__(
            _sse(run, shapes),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._run = run
        self._gw = gw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            _finish(self._run, self._gw)


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Awaits ``work``, cancelling it (which aborts its requests) if the client hangs up."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
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


class _CountRequests:
    """ASGI middleware counting every HTTP response by endpoint and status."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
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
        endpoint = path if path in ENDPOINTS else "other"
        if path.startswith(DEBUG_REQUESTS):
            endpoint = DEBUG_REQUESTS  # one label for every request id
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.requests.labels(endpoint, str(status)).inc()
