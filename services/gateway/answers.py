"""How a run becomes its HTTP answer: the chat and completions objects and chunks, or the
Responses API's object and events (a stored response keeps its conversation). No framework."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from services.gateway import sse
from services.gateway.requests import PreparedRequest
from services.gateway.response_shapes import ResponseShapes
from services.gateway.responses import Shapes
from services.gateway.responses_api import ResponseStore, input_messages, output_messages
from services.gateway.schemas import ChatMessage
from services.gateway.schemas_responses import ResponsesRequest
from services.gateway.service import Run
from shared.model.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Answer:
    """How a run becomes the HTTP answer: one JSON object, or a stream of SSE bytes."""

    whole: Callable[[Run], dict[str, Any]]
    stream: Callable[[Run], AsyncIterator[bytes]]


def chat_answer(prepared: PreparedRequest, tokenizer: Tokenizer) -> Answer:
    shapes = Shapes(prepared, tokenizer)
    return Answer(
        lambda run: shapes.response(run.choices), lambda run: sse.chat_events(run, shapes)
    )


def response_answer(
    store: ResponseStore,
    body: ResponsesRequest,
    prepared: PreparedRequest,
    history: list[ChatMessage],
) -> Answer:
    """The Responses API's answer; a stored response keeps its conversation for the next."""
    shapes = ResponseShapes(prepared, body)
    tenant = prepared.choices[0].request.tenant

    def done() -> None:
        if body.store is not False:
            turn = input_messages(body) + output_messages(shapes.output.items)
            store.put(shapes.id, tenant, history + turn)

    def whole(run: Run) -> dict[str, Any]:
        answer = shapes.response(run.choices)
        done()
        return answer

    return Answer(whole, lambda run: sse.response_events(run, shapes, done))
