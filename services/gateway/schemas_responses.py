"""The request body of ``POST /v1/responses`` (OpenAI's Responses API, its core), as strict
pydantic models. Values are checked where the request is translated (``responses_api``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from services.gateway.schemas import (
    FUNCTION_NAME,
    CacheControl,
    StreamOptions,
    Strict,
    StructuredOutputs,
    refused,
)


class InputText(Strict):
    type: Literal["input_text", "output_text", "text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class InputMessage(Strict):
    """A message of the conversation; ``content`` is text or a list of text parts."""

    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(Strict):
    """A call the model made earlier (``output`` of an earlier response)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(Strict):
    """What a called function returned."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


InputItem = InputMessage | FunctionCallItem | FunctionCallOutput


class FunctionTool(Strict):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionChoice(Strict):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)


class TextFormatPlain(Strict):
    type: Literal["text"]


class TextFormatJsonObject(Strict):
    type: Literal["json_object"]


class TextFormatJsonSchema(Strict):
    type: Literal["json_schema"]
    name: str
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextConfig(Strict):
    format: (
        Annotated[
            TextFormatPlain | TextFormatJsonObject | TextFormatJsonSchema,
            Field(discriminator="type"),
        ]
        | None
    ) = None
    verbosity: Any = refused("medium")


class ResponsesRequest(Strict):
    """``POST /v1/responses``."""

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, json_schema_extra={"minimum": 1})
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    # Crescent's extensions, as on the chat endpoint.
    cache_salt: str | None = None
    cache_control: CacheControl | None = None
    structured_outputs: StructuredOutputs | None = None
    # Not supported unless they carry their neutral value.
    reasoning: Any = refused()
    include: Any = refused([])
    truncation: Any = refused("disabled")
    service_tier: Any = refused("auto", "default")
    background: Any = refused(False)
    top_logprobs: Any = refused(0)
    prompt_cache_key: Any = refused()
    max_tool_calls: Any = refused()
