"""A family other than Llama served through `crescent up --model`: a tiny random Qwen 3 with a
chat template in Qwen's tool syntax (a small one written for the tests), called with the
openai client.

The prompt is the model's own template rendered with the tools (usage counts its tokens), the
answer streams, and a forced call comes back as a streamed tool call parsed from Qwen's
``<tool_call>`` syntax.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from shared.model.tokenizer import Tokenizer
from tests.e2e.conftest import ALICE_KEY, stack_env
from tests.e2e.stack import Stack, collect_logs
from tests.gateway.test_tool_syntax_templates import HERMES
from tests.support.tiny_models import tiny_model_folder

pytestmark = pytest.mark.slow


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    folder = tmp_path_factory.mktemp("family") / "tiny-qwen3"
    shutil.copytree(tiny_model_folder("qwen3", cache_dir), folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.pop("chat_template", None)
    config_file.write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(HERMES)
    return folder


@pytest.fixture(scope="module")
def qwen_stack(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, qwen_folder: Path
) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("family-stack")
    # Its own NATS server: the session's stack may be up beside it with the same node names.
    stack = Stack.start(data_dir, stack_env(cache_dir, "", "tcp"), ["--model", str(qwen_folder)])
    yield stack
    assert stack.stop() == 0, collect_logs(data_dir)


def test_the_model_is_listed_with_its_context(qwen_stack: Stack) -> None:
    client = OpenAI(base_url=qwen_stack.base_url, api_key=ALICE_KEY, max_retries=0)
    (card,) = client.models.list().data
    assert card.id == "tiny-qwen3"
    assert card.model_extra and card.model_extra["max_model_len"] > 0


def test_a_streamed_answer_from_the_qwen_template(qwen_stack: Stack) -> None:
    client = OpenAI(base_url=qwen_stack.base_url, api_key=ALICE_KEY, max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model="tiny-qwen3",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 12


def test_a_forced_call_streams_in_qwens_tool_syntax(qwen_stack: Stack, qwen_folder: Path) -> None:
    client = OpenAI(base_url=qwen_stack.base_url, api_key=ALICE_KEY, max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model="tiny-qwen3",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=64,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert calls and calls[0].function and calls[0].function.name == "get_weather"
    arguments = "".join(tc.function.arguments or "" for tc in calls if tc.function)
    assert json.loads(arguments)["city"] in ("Paris", "Oslo", "Lima")
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["tool_calls"]
    # The prompt is the model's own template, rendered with the tools it was given.
    tokenizer = Tokenizer.from_dir(qwen_folder)
    expected = tokenizer.apply_chat_template(MESSAGES, True, [WEATHER])
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == len(expected)
