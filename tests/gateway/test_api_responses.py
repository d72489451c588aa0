"""``POST /v1/responses`` through the official openai client, against the gateway and the fake
backend (whose reply a prompt's ``[[reply=...]]`` marker names)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.gateway.test_tools import CALL, WEATHER


def test_text_input_gives_a_completed_response(client: openai.OpenAI, model_name: str) -> None:
    response = client.responses.create(model=model_name, input="Hi [[reply=Hello there]]")
    assert response.status == "completed" and response.object == "response"
    assert response.id.startswith("resp_")
    assert response.output_text == "Hello there"
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant"
    usage = response.usage
    assert usage is not None and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_instructions_and_messages_render_as_a_chat(
    client: openai.OpenAI, model_name: str, http: httpx.Client
) -> None:
    messages = [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "And now? [[reply=Now this]]"},
    ]
    response = client.responses.create(
        model=model_name,
        instructions="Be brief.",
        input=messages,
        max_output_tokens=40,  # type: ignore[arg-type]
    )
    assert response.output_text == "Now this" and response.instructions == "Be brief."
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "And now? [[reply=Now this]]"},
    ]
    tokens = http.post("/tokenize", json={"messages": chat}).json()["count"]
    assert response.usage is not None and response.usage.input_tokens == tokens


def test_the_stream_has_typed_events_ending_with_the_response(
    client: openai.OpenAI, model_name: str
) -> None:
    events = list(
        client.responses.create(model=model_name, input="x [[reply=Streamed reply]]", stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "Streamed reply"
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "Streamed reply" and final.status == "completed"
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.id == final.output[0].id  # type: ignore[union-attr]


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI, model_name: str) -> None:
    response = client.responses.create(model=model_name, input="Hi", max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 3


def test_a_previous_response_continues_its_conversation(
    client: openai.OpenAI, model_name: str
) -> None:
    first = client.responses.create(model=model_name, input="Hi [[reply=One]]")
    second = client.responses.create(
        model=model_name, input="More [[reply=Two]]", previous_response_id=first.id
    )
    assert second.previous_response_id == first.id
    # The second prompt holds the first turn: its input and its answer.
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model_name, input="x", previous_response_id="resp_nope")
    unstored = client.responses.create(model=model_name, input="Hi [[reply=a]]", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model_name, input="x", previous_response_id=unstored.id)


def test_function_calls_come_back_as_items(client: openai.OpenAI, model_name: str) -> None:
    tool = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
    response = client.responses.create(
        model=model_name,
        input=f"Weather? [[reply={CALL}]]",
        tools=[tool],  # type: ignore[list-item]
    )
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris", "unit": "c"}
    follow = client.responses.create(
        model=model_name,
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}],
        tools=[tool],  # type: ignore[list-item]
    )
    assert follow.status == "completed"
