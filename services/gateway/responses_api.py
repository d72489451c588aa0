"""``POST /v1/responses`` in terms of the chat endpoint: its input, instructions, tools and
text format become a chat request (which the same builder validates and renders), and the
conversations of stored responses are kept for ``previous_response_id``. Pure."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from services.gateway import errors
from services.gateway.schemas import (
    CalledFunction,
    ChatCompletionRequest,
    ChatMessage,
    ToolCallIn,
)
from services.gateway.schemas_responses import (
    FunctionCallItem,
    FunctionCallOutput,
    FunctionChoice,
    InputItem,
    InputMessage,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)

#: Stored conversations a gateway keeps for ``previous_response_id``, the most recent ones.
MAX_STORED = 4096


@dataclass(slots=True)
class ResponseStore:
    """Owns the conversation behind each recent stored response (its input and its output,
    without its instructions), with the tenant that made it; only that tenant may continue
    it. Invariant: at most ``limit`` entries, the oldest dropped first."""

    limit: int = MAX_STORED
    entries: OrderedDict[str, tuple[str, list[ChatMessage]]] = field(default_factory=OrderedDict)

    def put(self, response_id: str, tenant: str, conversation: list[ChatMessage]) -> None:
        self.entries[response_id] = (tenant, conversation)
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)

    def conversation(self, response_id: str, tenant: str) -> list[ChatMessage]:
        found = self.entries.get(response_id)
        if found is None or found[0] != tenant:
            raise errors.ApiError(
                404,
                f"No stored response '{response_id[:100]}' of yours is known to this gateway.",
                param="previous_response_id",
                code="response_not_found",
            )
        self.entries.move_to_end(response_id)
        return list(found[1])


def input_messages(body: ResponsesRequest) -> list[ChatMessage]:
    """The request's input as chat messages (function calls and their outputs included)."""
    if isinstance(body.input, str):
        return [ChatMessage(role="user", content=body.input)]
    out: list[ChatMessage] = []
    for item in body.input:
        _add_item(out, item)
    if not out:
        raise errors.invalid("input must not be empty", "input")
    return out


def _add_item(out: list[ChatMessage], item: InputItem) -> None:
    if isinstance(item, InputMessage):
        content = item.content
        if not isinstance(content, str):
            content = "\n".join(part.text for part in content)
        out.append(ChatMessage(role=item.role, content=content))
    elif isinstance(item, FunctionCallItem):
        function = CalledFunction(name=item.name, arguments=item.arguments)
        call = ToolCallIn(id=item.call_id, type="function", function=function)
        last = out[-1] if out else None
        if last is not None and last.role == "assistant" and last.tool_calls:
            last.tool_calls.append(call)  # parallel calls share one assistant turn
        else:
            out.append(ChatMessage(role="assistant", tool_calls=[call]))
    elif isinstance(item, FunctionCallOutput):
        out.append(ChatMessage(role="tool", content=item.output, tool_call_id=item.call_id))


def to_chat(body: ResponsesRequest, history: list[ChatMessage]) -> ChatCompletionRequest:
    """The chat request that generates this response: instructions first, then the earlier
    conversation, then the new input."""
    messages = list(history)
    if body.instructions:
        messages.insert(0, ChatMessage(role="system", content=body.instructions))
    messages += input_messages(body)
    values: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "stream": body.stream,
        "stream_options": body.stream_options,
        "parallel_tool_calls": body.parallel_tool_calls,
        "cache_salt": body.cache_salt,
        "cache_control": body.cache_control,
        "structured_outputs": body.structured_outputs,
        "user": body.user,
        "safety_identifier": body.safety_identifier,
    }
    if body.tools:
        values["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in body.tools
        ]
    choice = body.tool_choice
    if isinstance(choice, FunctionChoice):
        values["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        values["tool_choice"] = choice
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, TextFormatJsonObject):
        values["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, TextFormatJsonSchema):
        spec = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
        values["response_format"] = {"type": "json_schema", "json_schema": spec}
    return ChatCompletionRequest.model_validate(values)


def output_messages(items: list[dict[str, Any]]) -> list[ChatMessage]:
    """A response's output items as the assistant's turn of the conversation."""
    text = "".join(
        part["text"] for item in items if item["type"] == "message" for part in item["content"]
    )
    calls = [
        ToolCallIn(
            id=item["call_id"],
            type="function",
            function=CalledFunction(name=item["name"], arguments=item["arguments"]),
        )
        for item in items
        if item["type"] == "function_call"
    ]
    return [ChatMessage(role="assistant", content=text or None, tool_calls=calls or None)]
