"""What the gateway answers, as pydantic models: they describe every response body in
``/openapi.json`` (the routes build plain dicts in ``responses``; a schema test checks that
the two agree). Fields may be added; none is removed without a major version."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

FinishReason = Literal["stop", "length", "tool_calls"]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error, in OpenAI's shape."""

    error: ErrorDetail


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="Prompt tokens whose KV came from the cache.")
    cached_tokens_by_tier: dict[str, int] = Field(
        description="Crescent: ``cached_tokens`` split by where the blocks were found "
        "(``dram``, ``nvme``, ``s3``); the values add up to ``cached_tokens``."
    )
    cache_write_tokens: int = Field(
        description="Prompt tokens whose KV this request newly cached (full blocks; 0 with "
        "cache_control write false, or when every block was cached already)."
    )
    cache_written_tokens: int = Field(
        description="Deprecated: the same as ``cache_write_tokens``, under its earlier name; "
        "removed in the next release.",
        json_schema_extra={"deprecated": True},
    )


class CompletionTokensDetails(BaseModel):
    cache_write_tokens: int = Field(
        description="Crescent: completion tokens whose KV this request newly cached (full "
        "blocks), for a next turn to reuse."
    )
    cache_written_tokens: int = Field(
        description="Deprecated: the same as ``cache_write_tokens``, under its earlier name; "
        "removed in the next release.",
        json_schema_extra={"deprecated": True},
    )


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="The arguments, as JSON text.")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletion(BaseModel):
    """The answer of ``POST /v1/chat/completions`` without ``stream``. With ``stream`` the
    answer is ``text/event-stream``: ``data:`` lines of ``chat.completion.chunk`` objects,
    then ``data: [DONE]``."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[ChatChoice]
    usage: Usage


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class Completion(BaseModel):
    """The answer of ``POST /v1/completions`` without ``stream`` (with it, SSE chunks of the
    same object, then ``data: [DONE]``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class HealthStatus(BaseModel):
    status: Literal["ok", "unavailable"]
    reason: str | None = None


class RequestView(BaseModel):
    """Where one recent request's time went (``GET /debug/requests/{id}``)."""

    id: str
    prompt_tokens: int
    completion_tokens: int
    resumes: int
    placed: dict[str, str]
    phases_s: dict[str, float]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class OutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]


class OutputMessage(BaseModel):
    type: Literal["message"]
    id: str
    status: str
    role: Literal["assistant"]
    content: list[OutputText]


class OutputFunctionCall(BaseModel):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: PromptTokensDetails
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponseObject(BaseModel):
    """The answer of ``POST /v1/responses`` without ``stream``. With ``stream`` the answer is
    ``text/event-stream`` of typed events (``response.created`` ... ``response.completed``)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "in_progress"]
    error: Any
    incomplete_details: dict[str, str] | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputMessage | OutputFunctionCall]
    parallel_tool_calls: bool
    previous_response_id: str | None
    temperature: float | None
    top_p: float | None
    tool_choice: Any
    tools: list[Any]
    text: Any
    truncation: str
    store: bool
    metadata: dict[str, str]
    user: str | None
    usage: ResponseUsage | None
