"""The gateway keeps a choice going when its node fails (the fake backend plays each fault):
the client sees the same text, once, whatever happened on the way."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from shared.model.tokenizer import Tokenizer
from tests.support.fake_engine import REPLY, FakeEngine


def chat(text: str) -> Any:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("fault", ["migrate", "gap", "ghost"])
def test_the_reply_survives_the_fault(
    client: openai.OpenAI, model_name: str, fake_engine: FakeEngine, fault: str
) -> None:
    messages = chat(f"Hi [[{fault}]]")
    response = client.chat.completions.create(model=model_name, messages=messages)
    assert response.choices[0].message.content == REPLY
    assert response.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=model_name, messages=messages, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == REPLY


def test_a_resumed_request_continues_from_what_the_client_has(
    client: openai.OpenAI, model_name: str, fake_engine: FakeEngine, tokenizer: Tokenizer
) -> None:
    response = client.chat.completions.create(model=model_name, messages=chat("[[migrate]]"))
    first = fake_engine.request(f"{response.id}-0")
    resumed = fake_engine.request(f"{response.id}-0-r1")
    assert first is not None and resumed is not None and resumed.resume
    reply = tokenizer.encode(REPLY, add_special_tokens=False)
    assert resumed.sampling.output_offset == 4
    assert resumed.prompt_token_ids == first.prompt_token_ids + reply[:4]
    assert resumed.sampling.max_tokens == first.sampling.max_tokens - 4
    usage = response.usage
    assert usage is not None and usage.completion_tokens == len(reply) + 1
    # The first attempt was handed back by its node: the gateway aborts it anyway.
    assert f"{response.id}-0" in fake_engine.aborts


def test_a_lost_chunk_is_replayed_not_resumed(
    client: openai.OpenAI, model_name: str, fake_engine: FakeEngine
) -> None:
    response = client.chat.completions.create(model=model_name, messages=chat("[[gap]]"))
    assert response.choices[0].message.content == REPLY
    assert fake_engine.request(f"{response.id}-0-r1") is None
