"""Checks of request bodies: the JSON text itself, then single OpenAI parameters (what
Crescent refuses, stop strings, chat messages). Pure; every failure is a 400 ``ApiError``,
naming the parameter where there is one."""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

from pydantic import BaseModel

from services.gateway import errors
from services.gateway.schemas import ChatMessage

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
#: Deepest nesting of arrays and objects in a body. A real request nests a few levels
#: (``messages[i].content[j]`` is four); deeper bodies are refused before parsing, whose
#: recursion they would otherwise exhaust.
MAX_JSON_DEPTH = 64
#: Longest integer literal: every meaningful value fits (a 63-bit seed has 19 digits), and
#: longer ones are refused before Python converts them, which costs quadratic time.
MAX_INT_DIGITS = 32

_SHARED_UNSUPPORTED = ("prompt_cache_key", "service_tier")
CHAT_UNSUPPORTED = (
    *_SHARED_UNSUPPORTED,
    "functions",
    "function_call",
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
MESSAGE_UNSUPPORTED = ("function_call", "refusal", "audio")
# Values that ask for nothing beyond what Crescent does anyway.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "function_call": ("none",),
    "modalities": (["text"],),
    "service_tier": ("auto", "default"),
    "best_of": (1,),
}
_CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


# A JSON string, matched without backtracking; an unterminated one runs to the end.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = [1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256)]
_LONG_INT = re.compile(rb"(?<![\w.+-])-?\d{%d,}+(?![.eE])" % (MAX_INT_DIGITS + 1))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
_UNPARSABLE = "We could not parse the JSON body of your request. Send valid JSON."


class _RefusedJson(ValueError):
    """JSON that Python's parser would take but Crescent does not; the message says why."""


def decode_body(raw: bytes) -> dict[str, Any]:
    """The JSON object a request body holds. Refused with a 400: an empty body, invalid UTF-8,
    nesting beyond ``MAX_JSON_DEPTH``, ``NaN`` and ``Infinity``, numbers beyond a double,
    integers longer than ``MAX_INT_DIGITS``, lone surrogates, and anything but an object."""
    if not raw.strip():
        raise errors.invalid("The request body is empty. Send a JSON object.")
    _check_lexically(raw)
    try:
        data = json.loads(
            raw.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float
        )
    except UnicodeDecodeError:
        raise errors.invalid("The request body is not valid UTF-8.") from None
    except _RefusedJson as exc:
        raise errors.invalid(str(exc)) from None
    except (ValueError, RecursionError):
        raise errors.invalid(_UNPARSABLE) from None
    if not isinstance(data, dict):
        kind = _JSON_KINDS.get(type(data), "a number")
        raise errors.invalid(f"The request body must be a JSON object, not {kind}.")
    # A surrogate can only come from a \u escape, so most bodies skip the walk.
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(data):
        raise errors.invalid(
            "The JSON body contains a lone UTF-16 surrogate (an escape such as \\ud800 "
            "without its pair), which is not a character."
        )
    return data


def _check_lexically(raw: bytes) -> None:
    """Depth and integer length, read off the text outside strings (in C, no recursion)."""
    bare = _STRING.sub(b"", raw)
    brackets = bare.translate(None, _NOT_BRACKETS)
    if len(brackets) > MAX_JSON_DEPTH:
        depth = max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)))
        if depth > MAX_JSON_DEPTH:
            raise errors.invalid(
                f"The JSON body is nested {depth} levels deep; at most {MAX_JSON_DEPTH} "
                "are allowed."
            )
    if _LONG_INT.search(bare):
        raise errors.invalid(f"The JSON body has an integer of more than {MAX_INT_DIGITS} digits.")


def _refuse_constant(name: str) -> Any:
    raise _RefusedJson(f"The JSON body contains {name}, which is not a JSON number.")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise _RefusedJson(f"The number {shown} in the JSON body is too large.")
    return value


def _has_lone_surrogate(data: Any) -> bool:
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


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
