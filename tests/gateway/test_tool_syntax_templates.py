"""Chat templates with a tool syntax of their own: which syntax a template is detected as, the
setting that overrides it, and what such templates are given (tools, calls with arguments as
objects, tool answers in their own role). The templates here are small ones written for these
tests, each emitting its family's syntax."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from tokenizers import Tokenizer as BackendTokenizer

from services.gateway.config import GatewaySettings
from services.gateway.errors import ApiError
from services.gateway.requests import RequestBuilder
from services.gateway.schemas import ChatCompletionRequest, ChatMessage
from services.gateway.tool_syntax import CRESCENT, ParserSetting, detect, resolve
from services.gateway.tool_syntax.mistral import Mistral
from services.gateway.tools import TOOLS_HEADER, template_messages
from shared.model.tokenizer import Tokenizer
from tests.gateway.test_tools import TOOLS, WEATHER

HERMES = r"""
{%- if tools %}
{{- '<|im_start|>system\n# Tools\n<tools>' }}
{%- for tool in tools %}{{- '\n' + tool | tojson }}{%- endfor %}
{{- '\n</tools>\nCall one as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call>' }}
{{- '<|im_end|>\n' }}
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' }}
{%- elif m.role == 'assistant' and m.tool_calls %}
{{- '<|im_start|>assistant\n' + m.content }}
{%- for call in m.tool_calls %}
{{- '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
{{- call.function.arguments | tojson + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
"""

LLAMA3 = r"""
{%- if tools is not none %}
{{- '<|start_header_id|>system<|end_header_id|>\n\nAnswer a call as ' }}
{{- '{"name": function name, "parameters": dictionary of arguments}. Functions:\n' }}
{%- for t in tools %}{{- t | tojson + '\n' }}{%- endfor %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\n\n' + m.content | tojson + '<|eot_id|>' }}
{%- elif m.tool_calls %}
{%- for call in m.tool_calls %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + call.function.name }}
{{- '", "parameters": ' + call.function.arguments | tojson + '}<|eot_id|>' }}
{%- endfor %}
{%- else %}
{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + m.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

_MISTRAL = r"""
{%- for m in messages %}
{%- if m.role == 'user' %}
{%- if tools and loop.last %}{{- '[AVAILABLE_TOOLS] ' + tools | tojson + '[/AVAILABLE_TOOLS]' }}
{%- endif %}
{{- '[INST] ' + m.content + '[/INST]' }}
{%- elif m.role == 'assistant' and m.tool_calls %}
CALLS
{{- '</s>' }}
{%- elif m.role == 'assistant' %}
{{- ' ' + m.content + '</s>' }}
{%- elif m.role == 'tool' %}
{%- if m.tool_call_id | length != 9 %}{{- raise_exception('Tool call ids have 9 characters') }}
{%- endif %}
{{- '[TOOL_RESULTS] {"content": ' + m.content | tojson + ', "call_id": "' + m.tool_call_id }}
{{- '"}[/TOOL_RESULTS]' }}
{%- elif m.role == 'system' %}
{{- '[SYSTEM_PROMPT]' + m.content + '[/SYSTEM_PROMPT]' }}
{%- endif %}
{%- endfor %}
"""
MISTRAL_LISTED = _MISTRAL.replace(
    "CALLS",
    r"""{{- '[TOOL_CALLS] [' }}
{%- for call in m.tool_calls %}
{%- if call.id | length != 9 %}{{- raise_exception('Tool call ids have 9 characters') }}
{%- endif %}
{%- set out = call.function | tojson %}
{{- out[:-1] + ', "id": "' + call.id + '"}' }}
{%- if not loop.last %}{{- ', ' }}{%- endif %}
{%- endfor %}
{{- ']' }}""",
)
MISTRAL_NAMED = _MISTRAL.replace(
    "CALLS",
    r"""{%- for call in m.tool_calls %}
{{- '[TOOL_CALLS]' + call.function.name + '[ARGS]' + call.function.arguments | tojson }}
{%- endfor %}""",
)
# No tool syntax at all (as Gemma's, Phi-3.5's and SmolLM2's templates).
PLAIN = r"""
{%- for m in messages %}{{- '<start_of_turn>' + m.role + '\n' + m.content + '<end_of_turn>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}
"""


def with_template(tokenizer: Tokenizer, template: str) -> Tokenizer:
    """The test vocabulary with another chat template."""
    return Tokenizer(BackendTokenizer.from_str(tokenizer.backend_json()), {}, template)


def conversation(call_id: str = "call_1") -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "18 C"},
        {"role": "user", "content": "And now?"},
    ]  # fmt: skip


def rendered(tokenizer: Tokenizer, template: str, messages: list[dict[str, Any]]) -> str:
    builder = RequestBuilder(with_template(tokenizer, template), "m", 4096, 4)
    chat = [ChatMessage.model_validate(m) for m in messages]
    return builder.tokenizer.decode(builder.render(chat, True, TOOLS), skip_special_tokens=False)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (HERMES, "hermes"),
        (LLAMA3, "llama3_json"),
        (MISTRAL_LISTED, "mistral"),
        (MISTRAL_NAMED, "mistral"),
        (PLAIN, "crescent"),
        (None, "crescent"),
        # The markers alone, in a template that never reads tools.
        (PLAIN + "{#- <tool_call></tool_call> #}", "crescent"),
        # Two families' markers: unclear, so Crescent's own.
        (HERMES + "{#- [TOOL_CALLS] #}", "crescent"),
    ],
)
def test_templates_are_detected_conservatively(template: str | None, expected: str) -> None:
    assert detect(template).name == expected


def test_the_default_models_template_keeps_crescents_format(tokenizer: Tokenizer) -> None:
    assert detect(tokenizer.chat_template) is CRESCENT


def test_mistral_templates_say_which_form_they_write() -> None:
    listed, named = detect(MISTRAL_LISTED), detect(MISTRAL_NAMED)
    assert isinstance(listed, Mistral) and isinstance(named, Mistral)
    assert not listed.named and named.named


def test_the_setting_overrides_detection_and_refuses_unknown_names() -> None:
    for name in ("hermes", "llama3_json", "mistral", "crescent"):
        assert resolve(name, PLAIN).name == name
    assert resolve("auto", HERMES).name == "hermes"
    assert resolve("crescent", HERMES) is CRESCENT
    with pytest.raises(ValueError, match="unknown tool call parser"):
        resolve("qwen", HERMES)
    assert GatewaySettings(tool_call_parser="mistral").tool_call_parser == "mistral"
    with pytest.raises(ValidationError, match="tool_call_parser"):
        GatewaySettings(tool_call_parser="qwen")  # type: ignore[arg-type]
    assert "auto" in ParserSetting.__args__  # type: ignore[attr-defined]


def test_hermes_templates_get_the_tools_and_calls_as_objects(tokenizer: Tokenizer) -> None:
    text = rendered(tokenizer, HERMES, conversation())
    assert "<tools>\n" + '{"type": "function", "function": {"name": "get_weather"' in text
    assert TOOLS_HEADER not in text  # the template describes the tools, not Crescent
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}'
    assert f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>" in text
    assert "<tool_response>\n18 C\n</tool_response>" in text


def test_llama3_templates_get_tool_answers_in_their_own_role(tokenizer: Tokenizer) -> None:
    text = rendered(tokenizer, LLAMA3, conversation())
    assert '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}' in text
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"18 C"<|eot_id|>' in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("template", [MISTRAL_LISTED, MISTRAL_NAMED])
def test_mistral_templates_get_call_ids_they_accept(tokenizer: Tokenizer, template: str) -> None:
    kept = rendered(tokenizer, template, conversation("abcDEF123"))
    assert '"call_id": "abcDEF123"' in kept
    # An id of another shape becomes 9 letters and digits, the same in the call and answer.
    text = rendered(tokenizer, template, conversation("call_8f2e1d"))
    short = Mistral().template_call_id("call_8f2e1d")
    assert len(short) == 9 and short.isalnum() and f'"call_id": "{short}"' in text
    if template is MISTRAL_LISTED:
        assert f'"arguments": {{"city": "Paris", "unit": "c"}}, "id": "{short}"}}]' in text
    else:
        assert '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "c"}</s>' in text


def test_messages_reach_the_template_in_openais_shape() -> None:
    messages = [ChatMessage.model_validate(m) for m in conversation()]
    messages[2] = messages[2].model_copy(update={"name": "get_weather"})
    assert template_messages(messages, detect(HERMES)) == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
        {"role": "tool", "content": "18 C", "tool_call_id": "call_1", "name": "get_weather"},
        {"role": "user", "content": "And now?"},
    ]  # fmt: skip


def test_bad_calls_in_the_conversation_are_400s(tokenizer: Tokenizer) -> None:
    messages = conversation()
    messages[1]["tool_calls"][0]["function"]["arguments"] = "{oops"
    with pytest.raises(ApiError) as caught:
        rendered(tokenizer, HERMES, messages)
    assert caught.value.param == "messages[1].tool_calls[0].function.arguments"
    with pytest.raises(ApiError) as caught:  # the template itself refuses the id
        rendered(tokenizer, MISTRAL_LISTED, [*conversation()[:2], {"role": "tool", "content": "x"}])
    assert caught.value.param == "messages"


def test_a_chat_request_is_rendered_and_read_in_the_templates_syntax(
    tokenizer: Tokenizer,
) -> None:
    builder = RequestBuilder(with_template(tokenizer, LLAMA3), "m", 4096, 4)
    body = {"model": "m", "messages": conversation()[:1], "tools": [WEATHER]}
    prepared = builder.chat(ChatCompletionRequest.model_validate(body), "t")
    assert prepared.parse_tool_calls and prepared.tool_syntax.name == "llama3_json"
    prompt = tokenizer.decode(prepared.prompts[0], skip_special_tokens=False)
    assert '"parameters": dictionary of arguments' in prompt and '"name": "get_weather"' in prompt
    none = builder.chat(ChatCompletionRequest.model_validate(body | {"tool_choice": "none"}), "t")
    assert not none.parse_tool_calls and "Functions:" not in tokenizer.decode(none.prompts[0])
    forced = builder.chat(
        ChatCompletionRequest.model_validate(body | {"tool_choice": "required"}), "t"
    )
    assert '"parameters"' in forced.choices[0].request.sampling.grammar
    overridden = RequestBuilder(builder.tokenizer, "m", 4096, 4, tool_parser="crescent")
    plain = overridden.chat(ChatCompletionRequest.model_validate(body), "t")
    assert TOOLS_HEADER in tokenizer.decode(plain.prompts[0], skip_special_tokens=False)
