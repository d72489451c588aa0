"""Errors in OpenAI's terms: an HTTP status plus the ``{"error": {...}}`` body clients parse."""

from __future__ import annotations

import math
from typing import Any

from shared.errors import InvalidRequestError
from shared.messages import QUOTA

INVALID_REQUEST = "invalid_request_error"


class ApiError(Exception):
    """A failure the client is told about; owns its status, OpenAI error fields and headers.

    Invariant: ``status`` is an HTTP error status and ``body()`` has exactly OpenAI's four keys.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type_: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def from_invalid(exc: InvalidRequestError) -> ApiError:
    return ApiError(400, str(exc), param=exc.param)


def unsupported(param: str, why: str = "is not supported by this server") -> ApiError:
    return ApiError(400, f"'{param}' {why}", param=param, code="unsupported_parameter")


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key")


def model_not_found(name: str) -> ApiError:
    return ApiError(
        404,
        f"The model '{name}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def request_not_found(request_id: str) -> ApiError:
    return ApiError(
        404,
        f"No recent request '{request_id}' of yours is known to this gateway.",
        code="request_not_found",
    )


def route_not_found(method: str, path: str) -> ApiError:
    return ApiError(404, f"Invalid URL ({method} {path})", code="unknown_url")


def too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"Request body is larger than the limit of {limit} bytes.", code="request_too_large"
    )


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, type_="service_unavailable", code="service_unavailable")


def timed_out(seconds: float, what: str = "The request did not finish") -> ApiError:
    return ApiError(504, f"{what} within {seconds:g} s.", type_="timeout", code="timeout")


def internal(message: str = "The server had an error while processing the request.") -> ApiError:
    return ApiError(500, message, type_="server_error", code="internal_error")


def rate_limited(message: str, retry_after_s: float | None) -> ApiError:
    headers = {}
    if retry_after_s is not None and retry_after_s >= 0:
        # Retry-After takes whole seconds; rounding down would invite a retry that fails again.
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return ApiError(
        429, message, type_="rate_limit_error", code="rate_limit_exceeded", headers=headers
    )


def insufficient_quota(message: str, param: str) -> ApiError:
    """OpenAI's own answer to a quota exhausted; ``x-should-retry: false`` tells the openai
    client not to retry it at once (a quota frees only as what holds it ends)."""
    return ApiError(
        429,
        message,
        type_=QUOTA,
        param=param,
        code=QUOTA,
        headers={"x-should-retry": "false"},
    )


def from_backend(
    code: int | None, message: str | None, retry_after_s: float | None, kind: str = ""
) -> ApiError:
    """Translates the error of a TokenChunk or a refusal, raised by the scheduler or an
    engine; ``kind`` (``SubmitReply.error_kind``) says more than the status where it can."""
    text = message or "The backend could not serve the request."
    if code == 429 and kind == QUOTA:
        return insufficient_quota(text, "cache_control.keep")
    if code == 429:
        return rate_limited(text, retry_after_s)
    if code == 503:
        return unavailable(text)
    if code == 400:
        return invalid(text)
    return internal(text)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "json-or-python"}


def _is_type_tag(part: str) -> bool:
    # pydantic names the union member it tried (``str``, ``list[int]``) inside error locations.
    return part in _TYPE_TAGS or "[" in part or part.startswith(("function-", "lax-", "tagged-"))


def _param(loc: tuple[int | str, ...]) -> str | None:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            if parts:
                parts[-1] += f"[{item}]"
        elif item == "body" and not parts:
            continue
        elif _is_type_tag(item):
            break
        else:
            parts.append(item)
    return ".".join(parts) or None


def from_validation(details: list[Any]) -> ApiError:
    """A 400 for the first problem pydantic (or FastAPI) found in a request."""
    if not details:
        return invalid("The request is not valid.")
    first = details[0]
    param = _param(tuple(first.get("loc", ())))
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        return ApiError(
            400, f"Unrecognized request argument supplied: {param}", param=param,
            code="unknown_parameter",
        )  # fmt: skip
    if param is None:
        return invalid(f"The request body must be a JSON object ({first.get('msg', '')}).")
    if kind == "missing":
        return invalid(f"'{param}' is a required property", param)
    return invalid(f"Invalid value for '{param}': {first.get('msg', 'not valid')}", param)
