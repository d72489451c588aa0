"""How every service logs: plain text lines by default, one JSON object per line on
``CRESCENT_LOG_FORMAT=json``. A JSON line carries the ``request_id`` of the request being
handled (bound by ``bind_request`` where a request enters a service: its HTTP route at the
gateway, the bus delivery of a message that names one elsewhere), and the trace and span ids
when tracing is on, so one request's lines can be found across all services."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from shared.service_settings import ServiceSettings

#: The request a task is working for; None outside of one.
REQUEST_ID: ContextVar[str | None] = ContextVar("crescent_request_id", default=None)


@dataclass(slots=True)
class RequestTag:
    """A request whose id is learnt after its handling began (an HTTP request's, once its
    body is parsed and it is submitted): the tasks it starts share this one object, so the
    id named in any of them shows in the lines of all."""

    request_id: str | None = None


REQUEST_TAG: ContextVar[RequestTag | None] = ContextVar("crescent_request_tag", default=None)

#: Libraries whose debug output would bury Crescent's own (botocore logs every S3 request's
#: headers, aiosqlite every statement): they stay at INFO when Crescent debugs.
QUIET_LIBRARIES = ("aiosqlite", "asyncio", "botocore", "aiobotocore", "grpc", "urllib3", "ucxx")


class LogSettings(ServiceSettings):
    """The logging options every service reads; each field is ``CRESCENT_<NAME>``."""

    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text: one readable line per record; json: one JSON object per line, "
        "with request_id (and trace_id, span_id while tracing) where a request is handled",
    )


def bind_request(request_id: str | None) -> None:
    """Makes ``request_id`` the request of what this task (and the tasks it starts) logs."""
    REQUEST_ID.set(request_id)


def current_request_id() -> str | None:
    """The request this task works for: the one bound or in scope, else its tag's."""
    bound = REQUEST_ID.get()
    if bound is not None:
        return bound
    tag = REQUEST_TAG.get()
    return tag.request_id if tag is not None else None


@contextmanager
def tagged() -> Iterator[RequestTag]:
    """A tag for the request handled inside, named later by ``name_request``."""
    tag = RequestTag()
    token = REQUEST_TAG.set(tag)
    try:
        yield tag
    finally:
        REQUEST_TAG.reset(token)


def name_request(request_id: str) -> None:
    """Names the tagged request this task works for, if it has no name yet."""
    tag = REQUEST_TAG.get()
    if tag is not None and tag.request_id is None:
        tag.request_id = request_id


@contextmanager
def request_scope(request_id: str | None) -> Iterator[None]:
    """``request_id`` for the records logged inside; the previous one after."""
    token = REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        REQUEST_ID.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, service, logger, message, and
    the request and trace ids where known; an exception's traceback as ``exc``."""

    def __init__(
        self, service: str, trace_ids: Callable[[], tuple[str, str] | None] | None = None
    ) -> None:
        super().__init__()
        self.service = service
        self.trace_ids = trace_ids

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, Any] = {
            "ts": f"{seconds}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or current_request_id()
        if request_id:
            entry["request_id"] = request_id
        ids = self.trace_ids() if self.trace_ids is not None else None
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(
    service: str,
    settings: LogSettings | None = None,
    trace_ids: Callable[[], tuple[str, str] | None] | None = None,
) -> None:
    """Configures the root logger of a service process (once, at start)."""
    settings = settings or LogSettings()
    handler = logging.StreamHandler()
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(service, trace_ids))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s")
        )
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler], force=True)
    if logging.getLogger().getEffectiveLevel() < logging.INFO:
        for name in QUIET_LIBRARIES:
            logging.getLogger(name).setLevel(logging.INFO)
