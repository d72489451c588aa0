"""Checks of single OpenAI parameters: what Crescent refuses, stop strings, chat messages.
Pure; every failure is a 400 ``ApiError`` naming the parameter."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from services.gateway import errors
from services.gateway.schemas import ChatMessage

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256

_SHARED_UNSUPPORTED = (
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "prompt_cache_key",
    "service_tier",
)
CHAT_UNSUPPORTED = (
    *_SHARED_UNSUPPORTED,
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "audio",
    "modalities",
    "prediction",
    "reasoning_effort",
    "store",
    "metadata",
    "web_search_options",
    "verbosity",
    "prompt_cache_retention",
)
COMPLETION_UNSUPPORTED = (*_SHARED_UNSUPPORTED, "echo", "best_of", "suffix")
MESSAGE_UNSUPPORTED = ("tool_calls", "tool_call_id", "function_call", "refusal", "audio")
# Values that ask for nothing beyond what Crescent does anyway.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "tool_choice": ("none",),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
    "service_tier": ("auto", "default"),
    "repetition_penalty": (1,),
    "best_of": (1,),
}
_CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def reject_unsupported(body: BaseModel, names: tuple[str, ...], prefix: str = "") -> None:
    """Raises a 400 naming the first field that asks for something Crescent cannot do."""
    for name in names:
        value = getattr(body, name)
        if value is None or value in (False, 0, "", [], {}) or value in _NEUTRAL.get(name, ()):
            continue
        raise errors.unsupported(prefix + name)


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stops) > MAX_STOP_STRINGS:
        raise errors.invalid(f"stop may list at most {MAX_STOP_STRINGS} strings", "stop")
    if any(not 0 < len(s) <= MAX_STOP_LENGTH for s in stops):
        raise errors.invalid(f"each stop string must be 1 to {MAX_STOP_LENGTH} characters", "stop")
    return stops


def message_dict(i: int, message: ChatMessage) -> dict[str, Any]:
    reject_unsupported(message, MESSAGE_UNSUPPORTED, prefix=f"messages[{i}].")
    role = _CHAT_ROLES.get(message.role)
    if role is None:
        raise errors.invalid(
            f"messages[{i}].role must be one of {', '.join(_CHAT_ROLES)}, got {message.role!r}",
            f"messages[{i}].role",
        )
    content = message.content
    if isinstance(content, list):
        content = "\n".join(_text_part(i, j, part) for j, part in enumerate(content))
    if content is None:
        if role != "assistant":
            raise errors.invalid(f"messages[{i}].content is required", f"messages[{i}].content")
        content = ""
    out: dict[str, Any] = {"role": role, "content": content}
    if message.name is not None:
        out["name"] = message.name
    return out


def _text_part(i: int, j: int, part: dict[str, Any]) -> str:
    param = f"messages[{i}].content[{j}]"
    if part.get("type") != "text":
        raise errors.invalid(f"{param}: only text content parts are supported", param)
    text = part.get("text")
    if not isinstance(text, str):
        raise errors.invalid(f"{param}.text must be a string", param)
    return text
