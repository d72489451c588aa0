"""Chat templates given tools render as transformers' ``apply_chat_template(messages,
tools=...)`` renders them, with the messages in the shape the gateway hands templates (calls'
arguments as objects, tool answers in the ``tool`` role)."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway.schemas import ChatMessage
from services.gateway.tool_syntax import detect
from services.gateway.tools import template_messages
from shared.model.tokenizer import Tokenizer
from tests.gateway.test_tool_syntax_templates import (
    HERMES,
    LLAMA3,
    MISTRAL_LISTED,
    MISTRAL_NAMED,
    conversation,
    with_template,
)
from tests.gateway.test_tools import TIME, WEATHER


@pytest.mark.parametrize("template", [HERMES, LLAMA3, MISTRAL_LISTED, MISTRAL_NAMED])
@pytest.mark.parametrize("with_tools", [True, False])
def test_tools_render_as_transformers_renders_them(
    tokenizer: Tokenizer, hf_tokenizer: Any, template: str, with_tools: bool
) -> None:
    chat = [ChatMessage.model_validate(m) for m in conversation("a1b2c3d4e")]
    messages = template_messages(chat, detect(template))
    tools = [WEATHER, TIME] if with_tools else None
    expected = hf_tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True
    )
    ours = with_template(tokenizer, template)
    assert ours.render_chat(messages, True, tools) == expected
    assert ours.apply_chat_template(messages, True, tools) == tokenizer.encode(expected, False)
