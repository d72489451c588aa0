"""The whole stack through the official openai client: gateway, scheduler, a prefill node, KV
pulled over UCX, a decode node. Real NATS, real model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from shared.model.tokenizer import Tokenizer
from shared.sampling_params import SamplingParams
from tests.conftest import RealEngineFactory
from tests.e2e import disaggregated
from tests.e2e.conftest import ALICE_KEY, BOB_KEY
from tests.e2e.heartbeats import busy, fresh_heartbeats, idle, next_beat
from tests.e2e.stack import Stack
from tests.support.nats import NatsServer

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
POEM = [{"role": "user", "content": "Write a short poem about the sea."}]
NODES = ("prefill-0", "decode-0")


def crescent_generate(cache_dir: Path, *args: str) -> str:
    env = os.environ | {"CRESCENT_CACHE_DIR": str(cache_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "crescent", "generate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    return done.stdout


def test_greedy_chat_equals_crescent_generate(
    client: OpenAI, model_name: str, cache_dir: Path, tmp_path: Path
) -> None:
    messages = tmp_path / "poem.json"
    messages.write_text(json.dumps(POEM))
    expected = crescent_generate(cache_dir, "--messages", str(messages), "--max-tokens", "40")
    reply = client.chat.completions.create(
        model=model_name,
        messages=POEM,
        max_tokens=40,
        temperature=0,  # type: ignore[arg-type]
    )
    assert reply.choices[0].message.content == expected
    assert reply.choices[0].finish_reason == "length"


def test_greedy_completion_equals_crescent_generate(
    client: OpenAI, model_name: str, cache_dir: Path
) -> None:
    prompt = "def fibonacci(n):\n"
    expected = crescent_generate(cache_dir, "--prompt", prompt, "--max-tokens", "30")
    reply = client.completions.create(model=model_name, prompt=prompt, max_tokens=30, temperature=0)
    assert reply.choices[0].text == expected


def test_streamed_text_equals_the_whole_answer_and_usage_is_right(
    client: OpenAI, model_name: str, tokenizer: Tokenizer, make_real_engine: RealEngineFactory
) -> None:
    whole = client.chat.completions.create(
        model=model_name,
        messages=QUESTION,
        temperature=0,  # type: ignore[arg-type]
    )
    stream = client.chat.completions.create(
        model=model_name,
        messages=QUESTION,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content == "The capital of France is Paris."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    prompt_ids = tokenizer.apply_chat_template(QUESTION)
    out = make_real_engine().generate([prompt_ids], SamplingParams(max_tokens=64, temperature=0))
    usage = chunks[-1].usage
    assert usage is not None and whole.usage is not None
    for u in (usage, whole.usage):
        assert u.prompt_tokens == len(prompt_ids)
        assert u.completion_tokens == len(out[0].output_token_ids)  # EOS included, as vLLM does
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_stop_strings_end_the_answer_and_never_leak(client: OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(
        model=model_name,
        messages=QUESTION,
        temperature=0,
        stop=["Paris"],  # type: ignore[arg-type]
    )
    assert reply.choices[0].message.content == "The capital of France is "
    assert reply.choices[0].finish_reason == "stop"


def test_n_choices_and_seeds(client: OpenAI, model_name: str) -> None:
    def sample(seed: int, n: int = 1) -> list[str]:
        reply = client.completions.create(
            model=model_name,
            prompt="Once upon a time",
            max_tokens=16,
            temperature=1.0,
            seed=seed,
            n=n,
        )
        assert [c.index for c in reply.choices] == list(range(n))
        return [c.text for c in reply.choices]

    two = sample(7, n=2)
    assert len(two) == 2 and two[0] != two[1]
    assert sample(7) == sample(7) == two[:1]
    assert sample(8) != sample(7)


def test_logprobs(client: OpenAI, model_name: str) -> None:
    reply = client.chat.completions.create(
        model=model_name,
        messages=QUESTION,
        temperature=0,
        logprobs=True,  # type: ignore[arg-type]
        top_logprobs=3,
        max_tokens=6,
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == reply.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.token == entry.top_logprobs[0].token  # greedy picks the most likely
        assert entry.logprob <= 0


@pytest.mark.parametrize(
    ("kwargs", "status", "needle"),
    [
        ({"temperature": 5}, 400, "temperature"),
        ({"model": "no-such-model"}, 404, "no-such-model"),
        ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "8192"),
        ({"logit_bias": {"1": 500}}, 400, "logit_bias"),
    ],
)
def test_bad_requests_get_openai_errors_and_the_stack_keeps_serving(
    client: OpenAI, model_name: str, kwargs: dict[str, object], status: int, needle: str
) -> None:
    request = {"model": model_name, "messages": QUESTION, "max_tokens": 4} | kwargs
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(**request)  # type: ignore[call-overload]
    assert err.value.status_code == status
    body = err.value.response.json()
    assert set(body["error"]) >= {"message", "type", "param", "code"}
    assert needle in body["error"]["message"]
    after = client.chat.completions.create(
        model=model_name,
        messages=QUESTION,
        temperature=0,  # type: ignore[arg-type]
    )
    assert after.choices[0].message.content == "The capital of France is Paris."


def test_a_short_prompt_is_prefilled_on_the_decode_node_and_a_long_one_crosses_ucx(
    client: OpenAI, model_name: str, nats_server: NatsServer, stack: Stack
) -> None:
    """Conditional disaggregation: a prompt of a few tokens costs less on the decode node than
    a hand-off; a long one beside a decoding stream would pause it longer than a hand-off
    takes, so a prefill node computes it and its KV crosses UCX."""
    # The scheduler places by heartbeats: wait until they count the earlier tests' requests done.
    asyncio.run(next_beat(nats_server.url, "decode-0", idle, "decode-0 idle"))
    short = client.completions.create(
        model=model_name, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert short.choices[0].text.strip().startswith("Paris")
    short_view = debug_view(stack, short.id)
    assert short_view["placed"] == {"prefill_node": "decode-0", "decode_node": "decode-0"}
    assert "kv_handoff" not in short_view["phases_s"], short_view
    before = asyncio.run(fresh_heartbeats(nats_server.url, NODES))["decode-0"].kv_bytes_received

    report = " ".join(
        f"Line {i} of a long report on the tides at {os.getpid()}." for i in range(90)
    )
    long_id, streamed = asyncio.run(
        long_prompt_beside_a_stream(stack, model_name, report, nats_server.url)
    )
    assert "1" in streamed and "10" in streamed  # the stream went on
    long_view = debug_view(stack, long_id)
    assert long_view["prompt_tokens"] > 1000
    assert long_view["placed"] == {"prefill_node": "prefill-0", "decode_node": "decode-0"}
    assert long_view["phases_s"]["kv_handoff"] > 0, long_view
    beats = asyncio.run(fresh_heartbeats(nats_server.url, NODES))
    prefill, decode = beats["prefill-0"], beats["decode-0"]
    assert prefill.pid != decode.pid and stack.proc.pid not in (prefill.pid, decode.pid)
    assert prefill.transfer_kind == "ucx" and decode.local_prefill
    assert prefill.kv_bytes_sent > 0
    assert decode.kv_bytes_received > before


async def long_prompt_beside_a_stream(
    stack: Stack, model_name: str, prompt: str, nats_url: str
) -> tuple[str, str]:
    """Sends ``prompt`` once a long stream is decoding (and the scheduler has seen it on the
    decode node); returns the long request's id and the stream's text up to then. The stream
    is held to 1000 tokens by ``min_tokens`` (seconds even at full speed) and hung up once
    ``prompt`` is answered."""
    aclient = AsyncOpenAI(base_url=stack.base_url, api_key=ALICE_KEY, max_retries=0, timeout=300)
    started = asyncio.Event()
    text: list[str] = []

    async def stream() -> None:
        chunks = await aclient.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": "Count from 1 to 200, separated by commas."}],
            max_tokens=1000,
            temperature=0,
            stream=True,
            extra_body={"min_tokens": 1000},
        )
        async for chunk in chunks:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                if len("".join(text)) > 8:
                    started.set()

    streaming = asyncio.create_task(stream())
    await asyncio.wait_for(started.wait(), 120)
    await next_beat(nats_url, "decode-0", busy, "decode-0's heartbeat counting the stream")
    assert not streaming.done()
    long = await aclient.chat.completions.create(
        model=model_name,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=4,
        temperature=0,
    )
    assert not streaming.done()  # the stream went on beside the hand-off
    streaming.cancel()  # hanging up ends it on the nodes too
    with contextlib.suppress(asyncio.CancelledError):
        await streaming
    return long.id, "".join(text)


def debug_view(stack: Stack, response_id: str) -> dict[str, Any]:
    return disaggregated.debug_view(stack, response_id, ALICE_KEY)


def test_sixteen_concurrent_streams_all_complete_correctly(
    stack: Stack, model_name: str, tokenizer: Tokenizer, make_real_engine: RealEngineFactory
) -> None:
    questions = [f"Count from {i} to {i + 5}, separated by commas." for i in range(16)]
    params = SamplingParams(max_tokens=24, temperature=0)
    expected = [
        tokenizer.decode(
            make_real_engine()
            .generate([tokenizer.apply_chat_template([{"role": "user", "content": q}])], params)[0]
            .output_token_ids
        )
        for q in questions
    ]

    async def one(aclient: AsyncOpenAI, question: str) -> str:
        stream = await aclient.chat.completions.create(
            model=model_name,
            messages=[{"role": "user", "content": question}],
            max_tokens=24,
            temperature=0,
            stream=True,
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def all_of_them() -> list[str]:
        aclient = AsyncOpenAI(
            base_url=stack.base_url, api_key=ALICE_KEY, max_retries=0, timeout=300
        )
        return await asyncio.gather(*(one(aclient, q) for q in questions))

    assert asyncio.run(all_of_them()) == expected


def test_tenants_do_not_share_cached_blocks(stack: Stack, model_name: str) -> None:
    document = " ".join(
        f"Item {i}: the {i}th line of a long shared system prompt." for i in range(60)
    )
    messages = [{"role": "system", "content": document}, {"role": "user", "content": "Summarize."}]

    def cached(key: str) -> int:
        client = OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model=model_name,
            messages=messages,
            max_tokens=2,
            temperature=0,  # type: ignore[arg-type]
        )
        assert reply.usage is not None and reply.usage.prompt_tokens > 500
        details = reply.usage.prompt_tokens_details
        return details.cached_tokens or 0 if details is not None else 0

    # A fresh prompt may reuse a few tokens of the chat template that the tenant's earlier
    # chats began with (never a whole block of 32: the document comes right after).
    assert cached(ALICE_KEY) < 32
    assert cached(ALICE_KEY) > 500  # the same tenant reuses its prompt
    assert cached(BOB_KEY) < 32  # another tenant does not see it
    assert cached(BOB_KEY) > 500
