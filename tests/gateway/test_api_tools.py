"""Tool calls through the official openai client, against the gateway and the fake backend
(which answers with the text a prompt's ``[[reply=...]]`` marker names)."""

from __future__ import annotations

import json
from typing import Any

import openai

from tests.gateway.test_tools import CALL, WEATHER

CALL_TEXT = "Let me look.\n" + CALL


def ask(reply: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Weather in Paris? [[reply={reply}]]"}]


def test_a_call_comes_back_as_tool_calls(client: openai.OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(
        model=model_name, messages=ask(CALL_TEXT), tools=[WEATHER], max_tokens=200,  # type: ignore[list-item]
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "c"}  # type: ignore[union-attr]


def test_a_streamed_call_arrives_as_deltas(client: openai.OpenAI, model_name: str) -> None:
    stream = client.chat.completions.create(
        model=model_name, messages=ask(CALL_TEXT), tools=[WEATHER], max_tokens=200,  # type: ignore[list-item]
        stream=True,
    )  # fmt: skip
    content, names, arguments, finish, ids = "", [], "", None, set()
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            assert call.index == 0
            if call.id:
                ids.add(call.id)
            if call.function and call.function.name:
                names.append(call.function.name)
            arguments += (call.function.arguments or "") if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Let me look." and names == ["get_weather"] and len(ids) == 1
    assert json.loads(arguments) == {"city": "Paris", "unit": "c"}
    assert finish == "tool_calls"


def test_with_tool_choice_none_the_text_stays_text(client: openai.OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(
        model=model_name, messages=ask(CALL_TEXT), tools=[WEATHER], tool_choice="none",  # type: ignore[list-item]
        max_tokens=200,
    )  # fmt: skip
    assert reply.choices[0].message.content == CALL_TEXT
    assert not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"


def test_a_conversation_with_tool_results_is_served(client: openai.OpenAI, model_name: str) -> None:
    messages: list[Any] = [
        *ask("It is 18 C in Paris."),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18"},
    ]  # fmt: skip
    reply = client.chat.completions.create(
        model=model_name, messages=messages, tools=[WEATHER], max_tokens=50,  # type: ignore[list-item]
    )  # fmt: skip
    assert reply.choices[0].message.content == "It is 18 C in Paris."
