"""The Responses API's shapes: the ``response`` object and its stream of typed events, built
from one choice's deltas. Pure: dicts in, dicts out."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from services.gateway.output import ChoiceAssembler, Delta
from services.gateway.requests import PreparedRequest
from services.gateway.responses import usage
from services.gateway.schemas_responses import ResponsesRequest
from services.gateway.tool_calls import CallArguments, CallStart, Content, ToolCallParser


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class OutputItems:
    """Owns the output items of one response as its text arrives: a message item for text,
    a function_call item per call (when the answer is read for calls). Every change comes out
    as the stream events that announce it. Invariant: items are in the order of the text,
    and each is opened once and closed once."""

    parse_calls: bool
    items: list[dict[str, Any]] = field(default_factory=list)
    _parser: ToolCallParser = field(default_factory=ToolCallParser)
    _open: dict[str, Any] | None = None

    def feed(self, text: str, final: bool) -> list[dict[str, Any]]:
        if not self.parse_calls:
            events = self._text(text) if text else []
        else:
            events = []
            for event in self._parser.feed(text) + (self._parser.finish() if final else []):
                if isinstance(event, Content):
                    events += self._text(event.text)
                elif isinstance(event, CallStart):
                    events += self._open_call(event)
                elif isinstance(event, CallArguments):
                    events += self._arguments(event.text)
        if final:
            events += self._close()
        return events

    def _text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if self._open is None or self._open["type"] != "message":
            events += self._close()
            item: dict[str, Any] = {
                "type": "message",
                "id": _item_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            events += self._start(item)
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(self._event("response.content_part.added", part=dict(part)))
            item["content"].append(dict(part))
        self._open["content"][0]["text"] += text  # type: ignore[index]
        events.append(self._event("response.output_text.delta", delta=text, logprobs=[]))
        return events

    def _open_call(self, call: CallStart) -> list[dict[str, Any]]:
        events = self._close()
        item = {
            "type": "function_call",
            "id": _item_id("fc"),
            "call_id": call.id,
            "name": call.name,
            "arguments": "",
            "status": "in_progress",
        }
        return events + self._start(item)

    def _arguments(self, text: str) -> list[dict[str, Any]]:
        assert self._open is not None
        self._open["arguments"] += text
        return [self._event("response.function_call_arguments.delta", delta=text)]

    def _start(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        self._open = item
        self.items.append(item)
        return [self._event("response.output_item.added", item=copy.deepcopy(item))]

    def _close(self) -> list[dict[str, Any]]:
        item, self._open = self._open, None
        if item is None:
            return []
        item["status"] = "completed"
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            events.append(
                self._event("response.output_text.done", text=part["text"], logprobs=[], item=item)
            )
            events.append(self._event("response.content_part.done", part=part, item=item))
        else:
            args = item["arguments"]
            events.append(
                self._event("response.function_call_arguments.done", arguments=args, item=item)
            )
        events.append(self._event("response.output_item.done", item=item))
        return events

    def _event(
        self, kind: str, item: dict[str, Any] | None = None, **fields: Any
    ) -> dict[str, Any]:
        item = item if item is not None else self._open
        assert item is not None
        event: dict[str, Any] = {"type": kind, "output_index": self.items.index(item)}
        if kind in ("response.output_item.added", "response.output_item.done"):
            event["item"] = item
        else:
            event["item_id"] = item["id"]
        if "content_part" in kind or "output_text" in kind:
            event["content_index"] = 0
        return event | fields


class ResponseShapes:
    """Builds one response's object and events. Owns its id, creation time and output items;
    stream events are numbered in order (``sequence_number``)."""

    def __init__(self, request: PreparedRequest, body: ResponsesRequest) -> None:
        self.request = request
        self.body = body
        self.id = _item_id("resp")
        self.created_at = request.created
        self.output = OutputItems(
            request.parse_tool_calls, _parser=ToolCallParser(request.tool_syntax)
        )
        self._sequence = 0

    def response(self, choices: Sequence[ChoiceAssembler]) -> dict[str, Any]:
        """The whole response, once every token is in (``feed`` got the whole text)."""
        (choice,) = choices
        if not self.output.items and not self.request.stream:
            self.output.feed(choice.text, final=True)
        cut = choice.finish_reason == "length"
        body = self._envelope("incomplete" if cut else "completed")
        body["output"] = self.output.items
        body["incomplete_details"] = {"reason": "max_output_tokens"} if cut else None
        body["usage"] = _usage(usage(self.request, choices))
        return body

    def _envelope(self, status: str) -> dict[str, Any]:
        b = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "model": self.request.model,
            "output": [],
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": b.previous_response_id,
            "temperature": b.temperature,
            "top_p": b.top_p,
            "tool_choice": _dump(b.tool_choice) or "auto",
            "tools": [_dump(t) for t in b.tools or []],
            "text": _dump(b.text) or {"format": {"type": "text"}},
            "truncation": "disabled",
            "store": b.store is not False,
            "metadata": b.metadata or {},
            "user": b.user,
            "usage": None,
        }

    def opening(self) -> list[dict[str, Any]]:
        created = self._envelope("in_progress")
        return [
            self._number({"type": "response.created", "response": created}),
            self._number({"type": "response.in_progress", "response": created}),
        ]

    def delta_events(self, delta: Delta) -> list[dict[str, Any]]:
        events = self.output.feed(delta.text, final=delta.finish_reason is not None)
        return [self._number(e) for e in events]

    def closing(self, choices: Sequence[ChoiceAssembler]) -> list[dict[str, Any]]:
        final = self.response(choices)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [self._number({"type": kind, "response": final})]

    def error_event(self, error: dict[str, Any]) -> dict[str, Any]:
        detail = error.get("error", {})
        return self._number(
            {
                "type": "error",
                "code": detail.get("code"),
                "message": detail.get("message"),
                "param": detail.get("param"),
            }
        )

    def _number(self, event: dict[str, Any]) -> dict[str, Any]:
        event["sequence_number"] = self._sequence
        self._sequence += 1
        return event


def _dump(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    return value.model_dump(by_alias=True, exclude_none=True)


def _usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": chat_usage["prompt_tokens_details"],
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": 0,
            **chat_usage["completion_tokens_details"],
        },
        "total_tokens": chat_usage["total_tokens"],
    }
