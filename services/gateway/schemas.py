"""HTTP request bodies of the OpenAI API, as pydantic models (types only; values are checked in
``requests``).

Unknown fields are rejected. Fields OpenAI (or vLLM) defines that Crescent does not implement
are declared loosely so that ``requests.reject_unsupported`` can name them in a 400 when a
client asks for them, and accept them when they carry their do-nothing value; their schema
admits only that value. Ranges checked in ``requests`` are stated in the schema too (as
``json_schema_extra``, so the 400 keeps its own wording).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.sampling_params import MAX_KEEP_TTL_S, MAX_PRIORITY, MAX_TBT_SLO_S


class Strict(BaseModel):
    # Validation errors never carry the values that failed: they may be a client's prompt,
    # and an error can end up in a log.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


def refused(*neutral: Any) -> Any:
    """A field Crescent does not implement: the schema admits only its do-nothing values (a
    request with another is refused with a 400 that names the field)."""
    return Field(
        default=None,
        json_schema_extra={"enum": [None, *neutral], "description": "Not supported."},
    )


class JsonSchemaSpec(Strict):
    """``response_format.json_schema``: the schema the answer must satisfy."""

    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextFormat(Strict):
    type: Literal["text"]


class JsonObjectFormat(Strict):
    type: Literal["json_object"]


class JsonSchemaFormat(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StructuredOutputs(Strict):
    """vLLM's ``structured_outputs``: exactly one constraint on the generated text."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


#: OpenAI's rule for function names.
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
#: The longest time to first token a request may ask for (a day).
MAX_TTFT_SLO_MS = 86_400_000.0
MAX_TBT_SLO_MS = MAX_TBT_SLO_S * 1000  # what a node accepts, in the field's unit


class FunctionDefinition(Strict):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    """A function the model may call (``tools[i]``)."""

    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Strict):
    name: str = Field(pattern=FUNCTION_NAME)


class NamedToolChoice(Strict):
    """``tool_choice`` naming the one function the model must call."""

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(Strict):
    name: str
    arguments: str


class ToolCallIn(Strict):
    """A call an earlier assistant message made (``messages[i].tool_calls[j]``)."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class KeepFor(Strict):
    """``cache_control.keep`` with a time: how long the prompt's blocks are kept."""

    ttl_s: float = Field(
        ge=0,
        le=MAX_KEEP_TTL_S,
        description="seconds from now the prompt's full blocks are kept; 0 drops their keep "
        "(a pin too)",
    )


class CacheControl(Strict):
    """Crescent's ``cache_control``: how a request uses the KV cache."""

    read: bool | None = Field(
        default=None, description="false: compute the whole prompt, reusing no cached block"
    )
    write: bool | None = Field(
        default=None, description="false: the blocks this request computes are not cached"
    )
    keep: Literal["pin"] | KeepFor | None = Field(
        default=None,
        description="keep the prompt's full blocks cached, within the tenant's quota: \"pin\" "
        'until dropped, {"ttl_s": N} for N seconds, {"ttl_s": 0} to drop a keep',
    )


class StreamOptions(Strict):
    """``stream_options``: only usage reporting changes what Crescent sends."""

    include_usage: bool | None = None
    # Padding against length side channels; Crescent sends no padding, so it is accepted as is.
    include_obfuscation: bool | None = None


class ChatMessage(Strict):
    """One message of a conversation; ``content`` is text or a list of text parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call this answers
    # Not supported; declared so the 400 can name them.
    function_call: Any = refused("none")
    refusal: Any = refused()
    audio: Any = refused()


class _Generation(Strict):
    """Fields chat and completions share."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    n: int | None = Field(default=None, json_schema_extra={"minimum": 1})
    seed: int | None = Field(default=None, json_schema_extra={"minimum": 0, "maximum": 2**63 - 1})
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
    stop_token_ids: list[int] | None = Field(default=None, json_schema_extra={"maxItems": 1024})
    cache_control: CacheControl | None = None
    # vLLM's: a lower value has its prompt computed sooner on its node.
    priority: int | None = Field(
        default=None, json_schema_extra={"minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY}
    )
    # Crescent's: the time to its first token the request asks for; its prompt is computed in
    # the order of the deadlines these give (earliest first).
    ttft_slo_ms: float | None = Field(
        default=None, json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_TTFT_SLO_MS}
    )
    # Crescent's: the longest time between tokens the request accepts; placement refuses it
    # (429) when no decode node is predicted to hold it.
    tbt_slo_ms: float | None = Field(
        default=None, json_schema_extra={"exclusiveMinimum": 0, "maximum": MAX_TBT_SLO_MS}
    )
    # Structured outputs, vLLM's way (``response_format`` is OpenAI's, chat only).
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # Not supported unless they carry their neutral value.
    prompt_cache_key: Any = refused()
    service_tier: Any = refused("auto", "default")
    safety_identifier: str | None = None


class ChatCompletionRequest(_Generation):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(json_schema_extra={"minItems": 1})
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: Any = refused([])
    function_call: Any = refused("none")
    response_format: ResponseFormat | None = None
    audio: Any = refused()
    modalities: Any = refused(["text"])
    prediction: Any = refused()
    reasoning_effort: Any = refused()
    store: Any = refused(False)
    metadata: Any = refused({})
    web_search_options: Any = refused()
    verbosity: Any = refused()
    prompt_cache_retention: Any = refused()


class CompletionRequest(_Generation):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: Any = refused(False)
    best_of: Any = refused(1)
    suffix: Any = refused()


class TokenizeCompletionRequest(Strict):
    """``POST /tokenize`` of a prompt text (vLLM's shape)."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool | None = None
    return_token_strs: bool | None = None


class TokenizeChatRequest(Strict):
    """``POST /tokenize`` of a conversation, rendered as ``/v1/chat/completions`` renders it."""

    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool | None = None
    return_token_strs: bool | None = None


class DetokenizeRequest(Strict):
    """``POST /detokenize``: token ids back to text."""

    model: str | None = None
    tokens: list[int]
