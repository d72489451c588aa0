"""The HTTP adapter: FastAPI routes that translate between OpenAI's API and the gateway core."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from services.gateway import errors, openapi
from services.gateway.answers import Answer, chat_answer, response_answer
from services.gateway.api_models import (
    ChatCompletion,
    Completion,
    DetokenizeResponse,
    HealthStatus,
    ModelCard,
    ModelList,
    RequestView,
    ResponseObject,
    TokenizeResponse,
)
from services.gateway.auth import ApiKeys
from services.gateway.completions import Completions
from services.gateway.docs_pages import OfflineDocs
from services.gateway.errors import ApiError
from services.gateway.http_io import (
    CLIENT_CLOSED,
    DEBUG_REQUESTS,
    CountRequests,
    off_loop_above,
    parse_body,
    read_json,
    unless_disconnected,
)
from services.gateway.metrics import GatewayMetrics
from services.gateway.phases import Recent
from services.gateway.requests import PreparedRequest, RequestBuilder
from services.gateway.responses_api import (
    ResponseStore,
    to_chat,
)
from services.gateway.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from services.gateway.schemas_responses import ResponsesRequest
from services.gateway.service import Run
from services.gateway.structured import asks_for_grammar
from services.gateway.tokenize import detokenize, tokenize
from shared import phases

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
B = TypeVar("B", ChatCompletionRequest, CompletionRequest)
ENDPOINTS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/models",
        "/health",
        "/healthz",
        "/readyz",
        "/livez",
        "/metrics",
        "/tokenize",
        "/detokenize",
    }
)
#: The JSON bodies the routes parse themselves, for ``/openapi.json``.
BODIES: dict[str, tuple[type[BaseModel], ...]] = {
    "/v1/chat/completions": (ChatCompletionRequest,),
    "/v1/completions": (CompletionRequest,),
    "/v1/responses": (ResponsesRequest,),
    "/tokenize": (TokenizeCompletionRequest, TokenizeChatRequest),
    "/detokenize": (DetokenizeRequest,),
}


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
    stored: ResponseStore = field(default_factory=ResponseStore)


def build_app(gateway: Gateway) -> FastAPI:
    """The gateway's routes; ``/docs`` and ``/redoc`` load Swagger UI and ReDoc from files
    installed with ``fastapi-offline``, never from a CDN."""
    app = FastAPIOffline(
        title="Crescent gateway",
        version="0.1.0",
        description="OpenAI-compatible API of a Crescent deployment, with its extensions.",
    )
    app.state.gateway = gateway
    _install_error_handlers(app)
    app.add_middleware(CountRequests, metrics=gateway.metrics, endpoints=ENDPOINTS)
    app.add_middleware(OfflineDocs)
    _add_routes(app, gateway)
    _describe_bodies(app, [gateway.builder.model_name], keyed=not gateway.keys.open)
    return app


def _describe_bodies(app: FastAPI, model_names: list[str], keyed: bool) -> None:
    """``/openapi.json`` describes the bodies the routes parse themselves, too, and where
    ``keyed``, the API key the routes that may answer 401 take (/docs' Authorize button)."""

    def described() -> dict[str, Any]:
        if not app.openapi_schema:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description,
                routes=app.routes,
            )  # fmt: skip
            schema = openapi.describe_bodies(schema, BODIES, model_names)
            app.openapi_schema = openapi.require_key(schema) if keyed else schema
        return app.openapi_schema

    app.openapi = described  # type: ignore[method-assign]


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

    @app.exception_handler(ClientDisconnect)
    async def gone(_: Request, exc: ClientDisconnect) -> JSONResponse:
        # The client left (or was cut off for a late body): no one reads this answer.
        return _error_response(ApiError(CLIENT_CLOSED, "The client closed the connection."))

    @app.exception_handler(Exception)
    async def crash(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return _error_response(errors.internal())


def _add_routes(app: FastAPI, gw: Gateway) -> None:
    generation = openapi.errors(*openapi.GENERATION_ERRORS)

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletion,
        responses=openapi.event_stream("A chat completion, or its stream", "chat.completion.chunk")
        | generation,
    )
    async def chat(request: Request) -> Response:
        arrived = time.monotonic()
        tenant = gw.keys.tenant(request.headers.get("authorization"))
        body, size = await parse_body(request, ChatCompletionRequest, gw.max_request_bytes)
        prepared = await _prepare(gw.builder.chat, body, tenant, size)
        return await _generate(request, gw, prepared, arrived)

    @app.post(
        "/v1/completions",
        response_model=Completion,
        responses=openapi.event_stream("A completion, or its stream", "text_completion")
        | generation,
    )
    async def completions(request: Request) -> Response:
        arrived = time.monotonic()
        tenant = gw.keys.tenant(request.headers.get("authorization"))
        body, size = await parse_body(request, CompletionRequest, gw.max_request_bytes)
        prepared = await _prepare(gw.builder.completion, body, tenant, size)
        return await _generate(request, gw, prepared, arrived)

    plain = openapi.errors(*openapi.PLAIN_ERRORS)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=plain)
    async def tokenize_route(request: Request) -> Any:
        gw.keys.tenant(request.headers.get("authorization"))
        data, _ = await read_json(request, gw.max_request_bytes)
        kind = TokenizeChatRequest if "messages" in data else TokenizeCompletionRequest
        body = kind.model_validate(data, strict=True)
        return JSONResponse(await run_in_threadpool(tokenize, gw.builder, body))

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=plain)
    async def detokenize_route(request: Request) -> Any:
        gw.keys.tenant(request.headers.get("authorization"))
        body, _ = await parse_body(request, DetokenizeRequest, gw.max_request_bytes)
        return JSONResponse(detokenize(gw.builder, body))

    @app.post(
        "/v1/responses",
        response_model=ResponseObject,
        responses=openapi.event_stream("A response, or its stream of events", "response event")
        | generation,
    )
    async def responses(request: Request) -> Response:
        arrived = time.monotonic()
        tenant = gw.keys.tenant(request.headers.get("authorization"))
        body, size = await parse_body(request, ResponsesRequest, gw.max_request_bytes)
        history: list[ChatMessage] = []
        if body.previous_response_id is not None:
            history = gw.stored.conversation(body.previous_response_id, tenant)
        prepared = await _prepare(gw.builder.chat, to_chat(body, history), tenant, size)
        answer = response_answer(gw.stored, body, prepared, history)
        return await _generate(request, gw, prepared, arrived, answer)

    @app.get("/v1/models", response_model=ModelList, responses=openapi.errors(401))
    async def models(request: Request) -> dict[str, Any]:
        gw.keys.tenant(request.headers.get("authorization"))
        return {"object": "list", "data": [_model_card(gw)]}

    @app.get("/v1/models/{name:path}", response_model=ModelCard, responses=openapi.errors(401, 404))
    async def model(request: Request, name: str) -> dict[str, Any]:
        gw.keys.tenant(request.headers.get("authorization"))
        if name != gw.builder.model_name:
            raise errors.model_not_found(name)
        return _model_card(gw)

    @app.get("/health", response_model=HealthStatus, responses={503: {"model": HealthStatus}})
    @app.get("/readyz", response_model=HealthStatus, responses={503: {"model": HealthStatus}})
    async def ready() -> JSONResponse:
        # Readiness: requests can be served now (a scheduler and both node roles are live).
        ok, reason = gw.completions.dispatcher.readiness()
        if ok:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "unavailable", "reason": reason}, 503)

    @app.get("/healthz", response_model=HealthStatus)
    @app.get("/livez", response_model=HealthStatus)
    async def live() -> JSONResponse:
        # Liveness: the process serves HTTP; restarting it would not help the cluster.
        return JSONResponse({"status": "ok"})

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        return Response(gw.metrics.render(), media_type=gw.metrics.content_type)

    @app.get(
        DEBUG_REQUESTS + "{request_id}",
        response_model=RequestView,
        responses=openapi.errors(401, 404),
    )
    async def request_phases(request: Request, request_id: str) -> Any:
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
    """Renders and tokenizes in a worker thread for a large body, and for one asking for a
    structured output, whose check waits on the grammar's compile; on the loop otherwise."""
    if asks_for_grammar(body):
        return await run_in_threadpool(build, body, tenant)
    return await off_loop_above(size, build, body, tenant)


async def _generate(
    request: Request,
    gw: Gateway,
    prepared: PreparedRequest,
    arrived: float,
    answer: Answer | None = None,
) -> Response:
    """Runs the request; ``answer`` shapes it (chat and completions objects by default)."""
    gw.metrics.in_flight.inc()
    try:
        run = await unless_disconnected(request, gw.completions.start(prepared))
    except BaseException:
        gw.metrics.in_flight.dec()
        raise
    run.phases.gateway(phases.PARSE, run.timing.start - arrived)
    answer = answer or chat_answer(prepared, gw.completions.tokenizer)
    if prepared.stream:
        return _RunStream(run, answer.stream(run), gw)
    try:
        await unless_disconnected(request, run.collect())
        return JSONResponse(answer.whole(run))
    finally:
        _finish(run, gw)


def _finish(run: Run, gw: Gateway) -> None:
    run.close()
    gw.completions.finished(run)
    view = run.debug_view()
    gw.recent.add(run.request.id, run.request.choices[0].request.tenant, view)
    gw.metrics.observe_run(run, view["phases_s"])
    gw.metrics.in_flight.dec()


class _RunStream(StreamingResponse):
    """An SSE response that owns its run: whatever ends the response (the last event, an
    error, or the client hanging up, even before the first byte) closes the run and aborts
    what still generates."""

    def __init__(self, run: Run, events: AsyncIterator[bytes], gw: Gateway) -> None:
        super().__init__(
            events,
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
