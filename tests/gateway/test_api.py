"""The served gateway against a real NATS server and the fake engine: the happy paths, through
the official openai client and raw HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from shared.model.tokenizer import Tokenizer
from tests.support.fake_engine import REPLY, FakeEngine, cached_tokens

HELLO: Any = [{"role": "user", "content": "Hello"}]


def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


def test_chat_non_streaming(
    client: openai.OpenAI, model_name: str, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    response = client.chat.completions.create(
        model=model_name, messages=HELLO, extra_body={"cache_salt": "s"}
    )
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    assert response.model == model_name
    (choice,) = response.choices
    assert choice.index == 0 and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content == REPLY
    request = fake_engine.request(f"{response.id}-0")
    assert request is not None and request.tenant == "default" and request.cache_salt == "s"
    assert request.prompt_token_ids == tokenizer.apply_chat_template(HELLO)
    usage = response.usage
    assert usage is not None and usage.prompt_tokens == len(request.prompt_token_ids)
    assert usage.completion_tokens == len(tokenizer.encode(REPLY, add_special_tokens=False)) + 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == cached_tokens(usage.prompt_tokens)


def test_chat_streaming_equals_non_streaming(client: openai.OpenAI, model_name: str) -> None:
    messages: Any = [{"role": "user", "content": "Stream [[shuffle]] please"}]
    whole = client.chat.completions.create(model=model_name, messages=messages, max_tokens=12)
    stream = client.chat.completions.create(
        model=model_name, messages=messages, max_tokens=12, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content and text
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage is None


def test_stream_ends_with_done_and_usage_chunk(http: httpx.Client, model_name: str) -> None:
    body = {
        "model": model_name,
        "messages": HELLO,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    usage_chunk = json.loads(events[-2])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["total_tokens"] > 0
    others = [json.loads(e) for e in events[:-2]]
    assert all(o["usage"] is None for o in others)
    text = "".join(o["choices"][0]["delta"].get("content", "") for o in others)
    assert text == REPLY


def test_completions_streaming_and_not(client: openai.OpenAI, model_name: str) -> None:
    whole = client.completions.create(model=model_name, prompt="Once upon", max_tokens=40)
    assert whole.object == "text_completion" and whole.choices[0].text == REPLY
    assert whole.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=model_name,
        prompt="Once upon",
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == REPLY
    assert chunks[-1].usage is not None and chunks[-1].usage == whole.usage


def test_completion_prompt_forms_and_n(
    client: openai.OpenAI, model_name: str, fake_engine: FakeEngine
) -> None:
    response = client.completions.create(
        model=model_name, prompt=[[26843], [25276, 25276]], n=2, max_tokens=40
    )
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert response.choices[0].text == REPLY and response.choices[1].text == REPLY + " Choice 1."
    prompts = [fake_engine.request(f"{response.id}-{i}") for i in range(4)]
    assert [p.prompt_token_ids for p in prompts if p] == [
        [26843],
        [26843],
        [25276] * 2,
        [25276] * 2,
    ]
    assert response.usage is not None and response.usage.prompt_tokens == 3


def test_chat_n_two_with_seed(
    client: openai.OpenAI, model_name: str, fake_engine: FakeEngine
) -> None:
    response = client.chat.completions.create(
        model=model_name, messages=HELLO, n=2, seed=1234, temperature=0.8, top_p=0.5
    )
    assert [c.index for c in response.choices] == [0, 1]
    assert response.choices[0].message.content == REPLY
    assert response.choices[1].message.content == REPLY + " Choice 1."
    first, second = (fake_engine.request(f"{response.id}-{i}") for i in range(2))
    assert first is not None and second is not None
    assert (first.sampling.seed, second.sampling.seed) == (1234, 1235)
    assert (first.sampling.temperature, first.sampling.top_p) == (0.8, 0.5)


def test_n_two_streaming(client: openai.OpenAI, model_name: str) -> None:
    stream = client.chat.completions.create(model=model_name, messages=HELLO, n=2, stream=True)
    texts = ["", ""]
    finishes = []
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes.append(choice.index)
    assert texts == [REPLY, REPLY + " Choice 1."] and sorted(finishes) == [0, 1]


def test_stop_strings_are_cut(client: openai.OpenAI, model_name: str) -> None:
    response = client.chat.completions.create(model=model_name, messages=HELLO, stop=["llo wö"])
    assert response.choices[0].message.content == "Hello! Crescent says hé"
    assert response.choices[0].finish_reason == "stop"
    stream = client.completions.create(
        model=model_name, prompt="x", stop="🌙", max_tokens=50, stream=True
    )
    text = "".join(c.choices[0].text for c in stream)
    assert text == "Hello! Crescent says héllo wörld "


def test_logprobs_shapes(client: openai.OpenAI, model_name: str, tokenizer: Tokenizer) -> None:
    chat = client.chat.completions.create(
        model=model_name, messages=HELLO, logprobs=True, top_logprobs=2, max_tokens=3
    )
    logprobs = chat.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert [e.token for e in logprobs.content] == ["Hello", "!", " Crescent"]
    assert [e.logprob for e in logprobs.content] == [0.0, -0.25, -0.5]
    assert all(len(e.top_logprobs) == 2 for e in logprobs.content)
    assert logprobs.content[0].bytes == list(b"Hello")
    completion = client.completions.create(model=model_name, prompt="x", logprobs=1, max_tokens=2)
    lp = completion.choices[0].logprobs
    assert lp is not None
    assert lp.tokens == ["Hello", "!"] and lp.token_logprobs == [0.0, -0.25]
    assert lp.top_logprobs == [{"Hello": 0.0}, {"!": -0.25}] and lp.text_offset == [0, 5]


def test_models_health_and_metrics(
    client: openai.OpenAI, model_name: str, http: httpx.Client
) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert client.models.retrieve(model_name).owned_by == "crescent"
    assert http.get("/health").json() == {"status": "ok"}
    client.chat.completions.create(model=model_name, messages=HELLO)
    metrics = http.get("/metrics")
    assert metrics.status_code == 200
    text = metrics.text
    assert 'crescent_gateway_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    for name in (
        "crescent_gateway_time_to_first_token_seconds_count",
        "crescent_gateway_time_per_output_token_seconds_count",
        "crescent_gateway_requests_in_flight 0.0",
    ):
        assert name in text
