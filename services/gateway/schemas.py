"""HTTP request bodies of the OpenAI API, as pydantic models (types only; values are checked in
``requests``).

Unknown fields are rejected. Fields OpenAI (or vLLM) defines that Crescent does not implement
are declared loosely so that ``requests.reject_unsupported`` can name them in a 400 when a
client asks for them, and accept them when they carry their do-nothing value.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Strict(BaseModel):
    # Validation errors never carry the values that failed: they may be a client's prompt,
    # and an error can end up in a log.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class StreamOptions(_Strict):
    """``stream_options``: only usage reporting changes what Crescent sends."""

    include_usage: bool | None = None
    # Padding against length side channels; Crescent sends no padding, so it is accepted as is.
    include_obfuscation: bool | None = None


class ChatMessage(_Strict):
    """One message of a conversation; ``content`` is text or a list of text parts."""

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    # Tool and audio messages are not supported; declared so the 400 can name them.
    tool_calls: Any = None
    tool_call_id: Any = None
    function_call: Any = None
    refusal: Any = None
    audio: Any = None


class _Generation(_Strict):
    """Fields chat and completions share."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    cache_salt: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions.
    include_stop_str_in_output: bool | None = None
    ignore_eos: bool | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    # Not supported unless they carry their neutral value.
    prompt_cache_key: Any = None
    service_tier: Any = None
    safety_identifier: str | None = None


class ChatCompletionRequest(_Generation):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: Any = None
    tool_choice: Any = None
    # Only means something together with tools, which are refused; accepted and ignored.
    parallel_tool_calls: bool | None = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    store: Any = None
    metadata: Any = None
    web_search_options: Any = None
    verbosity: Any = None
    prompt_cache_retention: Any = None


class CompletionRequest(_Generation):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: Any = None
    best_of: Any = None
    suffix: Any = None
