"""The rest of the OpenAI surface on the whole stack with the real model, through the official
openai client: structured outputs, forced tool calls (whole and streamed), penalties, and the
Responses API."""

from __future__ import annotations

import json
from typing import Any

import openai
import pydantic
import pytest
from openai import OpenAI

from tests.e2e.test_openai_e2e import POEM

pytestmark = pytest.mark.slow
EXTRACT = [{"role": "user", "content": "Bob is 42 years old. Extract his name and age."}]
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather like in Paris?"}]


class Person(pydantic.BaseModel):
    name: str
    age: int


class WeatherArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    city: str
    unit: str


WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
FORCED: Any = {"type": "function", "function": {"name": "get_weather"}}


def variety(text: str) -> float:
    """Distinct words per word of ``text``: lower for an answer that repeats itself."""
    words = text.lower().split()
    return len(set(words)) / max(len(words), 1)


def test_a_json_schema_answer_parses_into_the_model(client: OpenAI, model_name: str) -> None:
    completion = client.chat.completions.parse(
        model=model_name,
        messages=EXTRACT,
        response_format=Person,
        temperature=0,
        max_tokens=60,  # type: ignore[arg-type]
    )
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person)


def test_json_object_answers_parse(client: OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(
        model=model_name,
        messages=EXTRACT,
        response_format={"type": "json_object"},  # type: ignore[arg-type]
        temperature=0,
        max_tokens=80,
    )
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_a_forced_tool_call_has_arguments_that_fit_the_schema(
    client: OpenAI, model_name: str
) -> None:
    reply = client.chat.completions.create(
        model=model_name,
        messages=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice=FORCED,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=80,
    )
    choice = reply.choices[0]
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    WeatherArgs.model_validate_json(call.function.arguments)  # type: ignore[union-attr]
    assert choice.finish_reason == "tool_calls"


def test_a_streamed_forced_tool_call_has_arguments_that_fit_the_schema(
    client: OpenAI, model_name: str
) -> None:
    stream = client.chat.completions.create(
        model=model_name,
        messages=WEATHER_QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice=FORCED,  # type: ignore[arg-type]
        temperature=0,
        max_tokens=80,
        stream=True,
    )
    names, arguments, finish = [], "", None
    for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            names += [call.function.name] if call.function and call.function.name else []
            arguments += call.function.arguments or "" if call.function else ""
        finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
    assert names == ["get_weather"] and finish == "tool_calls"
    WeatherArgs.model_validate_json(arguments)


def test_penalties_cut_repetition(client: OpenAI, model_name: str) -> None:
    def poem(**penalties: float) -> str:
        reply = client.chat.completions.create(
            model=model_name,
            messages=POEM,
            temperature=0,
            max_tokens=80,
            **penalties,  # type: ignore[arg-type]
        )
        return reply.choices[0].message.content or ""

    plain = variety(poem())
    assert variety(poem(frequency_penalty=1.0)) > plain
    assert variety(poem(presence_penalty=1.5)) > plain
    assert variety(poem(frequency_penalty=-1.0)) < plain


def test_the_responses_api_answers_whole_and_streamed(client: OpenAI, model_name: str) -> None:
    question = "What is the capital of France? Answer in one sentence."
    whole = client.responses.create(model=model_name, input=question, temperature=0)
    assert whole.status == "completed" and whole.output_text == "The capital of France is Paris."
    events = list(client.responses.create(model=model_name, input=question, temperature=0,
                                          stream=True))  # fmt: skip
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text and events[-1].type == "response.completed"
    chained = client.responses.create(
        model=model_name, input="And of Italy?", previous_response_id=whole.id, temperature=0,
        max_output_tokens=30,
    )  # fmt: skip
    assert chained.output_text
    usage = chained.usage
    assert usage is not None and usage.input_tokens_details.cached_tokens > 0


def test_cache_control_skips_reading_the_cache(client: OpenAI, model_name: str) -> None:
    long = [{"role": "user", "content": "Summarize: " + "the tide comes in and goes out. " * 40}]

    def cached(**extra: Any) -> int:
        reply = client.chat.completions.create(
            model=model_name,
            messages=long,
            temperature=0,
            max_tokens=4,
            extra_body=extra,  # type: ignore[arg-type]
        )
        details = reply.usage.prompt_tokens_details  # type: ignore[union-attr]
        return details.cached_tokens or 0  # type: ignore[union-attr]

    cached()  # the prompt's blocks are cached from here on
    assert cached(cache_control={"read": False}) == 0
    assert cached() > 0


def test_a_requests_own_ttft_objective_is_held_and_priority_is_taken(
    client: OpenAI, model_name: str
) -> None:
    """``ttft_slo_ms`` or ``tbt_slo_ms`` too tight for any node is OpenAI's 429 with
    Retry-After, refused by the scheduler before any node works on it; reachable ones, and
    vLLM's ``priority``, answer."""
    long = [{"role": "user", "content": "Repeat: " + "a tide, a shore, a wave. " * 60}]
    for field, reason in (("ttft_slo_ms", "objective"), ("tbt_slo_ms", "time between tokens")):
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(
                model=model_name, messages=long, temperature=0, max_tokens=2,
                extra_body={field: 0.001},
            )  # fmt: skip
        assert reason in refused.value.message
        assert refused.value.response.headers.get("retry-after")
    reply = client.chat.completions.create(
        model=model_name, messages=long, temperature=0, max_tokens=2,
        extra_body={"ttft_slo_ms": 600_000, "tbt_slo_ms": 60_000, "priority": -1},
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "length"
