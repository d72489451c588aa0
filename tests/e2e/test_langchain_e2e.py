"""LangChain's ChatOpenAI against the whole stack with the real model, called the way its users
call it: invoke, stream and batch; structured output; a forced tool; penalties; and the
Responses API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from tests.e2e.conftest import ALICE_KEY
from tests.e2e.stack import Stack
from tests.e2e.test_openai_surface_e2e import Person, WeatherArgs, variety

pytestmark = pytest.mark.slow
QUESTION = "What is the capital of France? Answer in one sentence."
EXTRACT = "Bob is 42 years old. Extract his name and age."
PARIS = "The capital of France is Paris."


@tool
def get_weather(city: str, unit: str) -> str:
    """The current weather in a city, in celsius or fahrenheit."""
    return f"18 {unit} in {city}"


def chat_model(stack: Stack, model_name: str, **options: Any) -> ChatOpenAI:
    values: dict[str, Any] = {"temperature": 0, "max_tokens": 80, "max_retries": 0}
    return ChatOpenAI(
        model=model_name, base_url=stack.base_url, api_key=ALICE_KEY, timeout=120,  # type: ignore[arg-type]
        **(values | options),
    )  # fmt: skip


def test_invoke_stream_and_batch(stack: Stack, model_name: str) -> None:
    llm = chat_model(stack, model_name)
    assert llm.invoke(QUESTION).content == PARIS
    assert "".join(str(chunk.content) for chunk in llm.stream(QUESTION)) == PARIS
    answers = llm.batch([QUESTION, "Say hello."])
    assert answers[0].content == PARIS and answers[1].content


def test_structured_output_with_a_json_schema(stack: Stack, model_name: str) -> None:
    llm = chat_model(stack, model_name, max_tokens=200)
    person = llm.with_structured_output(Person, method="json_schema").invoke(EXTRACT)
    assert isinstance(person, Person)


def test_json_object_answers_parse(stack: Stack, model_name: str) -> None:
    llm = chat_model(stack, model_name, max_tokens=200)
    reply = llm.bind(response_format={"type": "json_object"}).invoke(EXTRACT)
    assert isinstance(json.loads(str(reply.content)), dict)
    assert isinstance(llm.with_structured_output(method="json_mode").invoke(EXTRACT), dict)


def test_a_forced_tool_is_called_with_arguments_that_fit(stack: Stack, model_name: str) -> None:
    llm = chat_model(stack, model_name, max_tokens=200)
    llm = llm.bind_tools([get_weather], tool_choice="get_weather")  # type: ignore[assignment]
    reply = llm.invoke("What is the weather like in Paris?")
    (call,) = reply.tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "get_weather"
    WeatherArgs.model_validate(call["args"])
    streamed: AIMessageChunk | None = None
    for chunk in llm.stream("What is the weather like in Paris?"):
        streamed = chunk if streamed is None else streamed + chunk  # type: ignore[assignment,operator]
    assert streamed is not None
    (call,) = streamed.tool_calls
    assert call["name"] == "get_weather"
    WeatherArgs.model_validate(call["args"])


def test_frequency_penalty_cuts_repetition(stack: Stack, model_name: str) -> None:
    poem = "Write a short poem about the sea."
    plain = str(chat_model(stack, model_name).invoke(poem).content)
    penalized = str(chat_model(stack, model_name, frequency_penalty=1.0).invoke(poem).content)
    assert variety(penalized) > variety(plain)


def test_the_responses_api_whole_and_streamed(stack: Stack, model_name: str) -> None:
    llm = chat_model(stack, model_name, use_responses_api=True)
    reply = llm.invoke(QUESTION)
    assert reply.text == PARIS
    streamed: AIMessageChunk | None = None
    for chunk in llm.stream(QUESTION):
        streamed = chunk if streamed is None else streamed + chunk  # type: ignore[assignment,operator]
    assert streamed is not None and streamed.text == PARIS
