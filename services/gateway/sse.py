"""Server-sent event streams of a run: chat and completions chunks (``data:`` lines ending
with ``[DONE]``) and the Responses API's typed events. No framework: bytes out."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from services.gateway import errors
from services.gateway.errors import ApiError
from services.gateway.response_shapes import ResponseShapes
from services.gateway.responses import Shapes
from services.gateway.service import Run

log = logging.getLogger(__name__)


def data_event(payload: dict[str, Any]) -> bytes:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def typed_event(payload: dict[str, Any]) -> bytes:
    """An event named by its ``type``, as the Responses API streams them."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {payload['type']}\ndata: {text}\n\n".encode()


async def chat_events(run: Run, shapes: Shapes) -> AsyncIterator[bytes]:
    for opening in shapes.role_chunks():
        yield data_event(opening)
    try:
        async for index, delta in run.deltas():
            for chunk in shapes.delta_chunks(index, delta):
                writing = time.monotonic()
                yield data_event(chunk)  # back here once the server has sent it on
                run.phases.wrote_event(time.monotonic() - writing)
        if run.request.include_usage:
            yield data_event(shapes.usage_chunk(run.choices))
    except ApiError as exc:
        # The status line is gone already; OpenAI clients raise on an error event.
        yield data_event(exc.body())
    except Exception:
        log.exception("stream of %s failed", run.request.id)
        yield data_event(errors.internal().body())
    yield b"data: [DONE]\n\n"


async def response_events(
    run: Run, shapes: ResponseShapes, done: Callable[[], None]
) -> AsyncIterator[bytes]:
    """The Responses API's stream; ``done`` runs once the response completed."""
    for opening in shapes.opening():
        yield typed_event(opening)
    try:
        async for _, delta in run.deltas():
            for event in shapes.delta_events(delta):
                writing = time.monotonic()
                yield typed_event(event)
                run.phases.wrote_event(time.monotonic() - writing)
        for event in shapes.closing(run.choices):
            yield typed_event(event)
        done()
    except ApiError as exc:
        yield typed_event(shapes.error_event(exc.body()))
    except Exception:
        log.exception("stream of %s failed", run.request.id)
        yield typed_event(shapes.error_event(errors.internal().body()))
