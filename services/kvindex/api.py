"""The HTTP side of kvindex: ``POST /v1/kv/query`` (``services.kvindex.query`` shows the
answer) and ``GET /v1/kv/publishers``. A bad request gets a 400 whose JSON says what is
wrong; a missing or wrong token a 401."""

from __future__ import annotations

import hmac
import json
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from services.kvindex.index import Key, KvIndex
from services.kvindex.query import (
    MAX_QUERY_BLOCKS,
    MAX_QUERY_TOKENS,
    answer,
    parse_key,
    prompt_keys,
    publishers,
    scope_root,
)

#: A body past this is refused unread (a 1M-token prompt as JSON is about 7 MiB).
MAX_BODY_BYTES = 8 << 20
Text = Field(default="", max_length=256)


class PrefixQuery(BaseModel):
    """A prompt as ``block_hashes`` (hex text or integers, as published), or as ``token_ids``
    with ``block_size`` and either the chain's ``root_hash`` (hex) or the scope a node hashes
    with: ``model``, ``kv_dtype``, ``tenant_id`` and ``cache_salt``."""

    model_config = ConfigDict(extra="forbid")

    block_hashes: list[StrictStr | StrictInt] | None = Field(
        default=None, max_length=MAX_QUERY_BLOCKS
    )
    token_ids: list[StrictInt] | None = Field(default=None, max_length=MAX_QUERY_TOKENS)
    block_size: int | None = Field(default=None, ge=1, le=1024)
    root_hash: str | None = Field(default=None, max_length=128)
    model: str = Text
    kv_dtype: str = Field(default="", max_length=32)
    tenant_id: str = Text
    cache_salt: str = Text

    @model_validator(mode="after")
    def _one_prompt(self) -> Self:
        if (self.block_hashes is None) == (self.token_ids is None):
            raise ValueError("give either block_hashes or token_ids")
        if self.token_ids is not None:
            if self.block_size is None:
                raise ValueError("token_ids need block_size")
            if self.root_hash is None and not (self.model and self.kv_dtype and self.tenant_id):
                raise ValueError("token_ids need root_hash, or model, kv_dtype and tenant_id")
            if any(not 0 <= t < 1 << 32 for t in self.token_ids):
                raise ValueError("token ids are unsigned 32-bit integers")
        return self

    def keys(self, secret: str) -> list[Key]:
        """The prompt's block hashes; ``ValueError`` on a malformed one."""
        if self.block_hashes is not None:
            return [parse_key(v) for v in self.block_hashes]
        assert self.token_ids is not None and self.block_size is not None
        if self.root_hash is not None:
            root = parse_key(self.root_hash)
            if not isinstance(root, bytes) or len(root) != 16:
                raise ValueError("root_hash is 16 bytes of hex")
        else:
            root = scope_root(
                secret, self.model, self.block_size, self.kv_dtype, self.tenant_id, self.cache_salt
            )
        return prompt_keys(self.token_ids, self.block_size, root)


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def build_app(index: KvIndex, secret: str, token: str | None) -> Starlette:
    """The app answering from ``index``; ``token``: what callers must present (None: anyone)."""

    def refused(request: Request) -> JSONResponse | None:
        if token is None:
            return None
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return None
        return error(401, "a valid 'Authorization: Bearer <token>' header is required")

    async def query(request: Request) -> JSONResponse:
        denied = refused(request)
        if denied is not None:
            return denied
        body = await _read_json(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            keys = PrefixQuery.model_validate(body).keys(secret)
        except ValidationError as exc:
            return error(400, _describe(exc))
        except ValueError as exc:
            return error(400, str(exc))
        return JSONResponse(answer(index.match(keys), len(keys)))

    async def listing(request: Request) -> JSONResponse:
        denied = refused(request)
        return denied or JSONResponse({"publishers": publishers(index.publishers)})

    routes = [
        Route("/v1/kv/query", query, methods=["POST"]),
        Route("/v1/kv/publishers", listing, methods=["GET"]),
    ]
    return Starlette(routes=routes)


async def _read_json(request: Request) -> Any:
    """The body as JSON, or the response refusing it (too large, not JSON)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return error(413, f"the body exceeds {MAX_BODY_BYTES} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            return error(413, f"the body exceeds {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return error(400, "the body is not JSON")


def _describe(exc: ValidationError) -> str:
    """The first problem pydantic found, where it is."""
    first = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(p) for p in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
