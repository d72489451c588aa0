"""Structured outputs: which grammar, if any, a request's text must follow. OpenAI's
``response_format`` (``json_object``, ``json_schema``) and vLLM's ``structured_outputs`` and
``guided_*`` fields each become one llguidance grammar, checked here against the served
vocabulary so that what no node could enforce is a 400 naming the field. Pure."""

from __future__ import annotations

import json
from typing import Any

from services.gateway import errors
from services.gateway.grammar_guard import GrammarGuard
from services.gateway.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    JsonObjectFormat,
    JsonSchemaFormat,
    StructuredOutputs,
)
from shared.errors import InvalidRequestError
from shared.model.grammar import (
    Grammars,
    any_json_object_grammar,
    choice_grammar,
    json_schema_grammar,
    lark_grammar,
    regex_grammar,
)

MAX_CHOICES = 1024


def asks_for_grammar(body: object) -> bool:
    """Whether a body asks for a structured output (whose check may wait on a compile)."""
    if not isinstance(body, ChatCompletionRequest | CompletionRequest):
        return False
    if body.structured_outputs is not None:
        return True
    # A required or named tool call is a grammar too, built from the tools' own schemas.
    if isinstance(body, ChatCompletionRequest) and body.tools and _forces_a_call(body):
        return True
    return any(value is not None for _, value in _constraints(body))


def _forces_a_call(body: ChatCompletionRequest) -> bool:
    return body.tool_choice not in (None, "none", "auto")


def requested_grammar(
    body: ChatCompletionRequest | CompletionRequest,
    grammars: Grammars,
    guard: GrammarGuard | None = None,
) -> tuple[str, str] | None:
    """The grammar the request's text must follow and the field that asked for it, or None.
    Raises a 400 when two fields ask, or when the grammar cannot be enforced, or (with a
    ``guard``) costs too much to compile; the guard blocks, so call it off the event loop."""
    asked = [(param, value) for param, value in _constraints(body) if value is not None]
    if not asked:
        return None
    if len(asked) > 1:
        names = ", ".join(param for param, _ in asked)
        raise errors.invalid(f"Ask for one structured output at a time, not {names}.", asked[1][0])
    param, value = asked[0]
    grammar = _grammar(param, value)
    try:
        grammars.check(grammar, param)
    except InvalidRequestError as exc:
        raise errors.invalid(f"{param} cannot be enforced: {exc}", param) from exc
    if guard is not None:
        guard.check(grammar, param)
        guard.check_schemas([_schema_of(value)], param)
    return grammar, param


def _schema_of(value: Any) -> Any:
    """The JSON schema a structured output gave, where it gave one as text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _constraints(body: ChatCompletionRequest | CompletionRequest) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = [
        ("guided_json", body.guided_json),
        ("guided_regex", body.guided_regex),
        ("guided_choice", body.guided_choice),
        ("guided_grammar", body.guided_grammar),
    ]
    if isinstance(body, ChatCompletionRequest):
        fmt = body.response_format
        if isinstance(fmt, JsonObjectFormat):
            found.append(("response_format", {}))
        elif isinstance(fmt, JsonSchemaFormat):
            found.append(("response_format", fmt.json_schema.schema_ or {}))
    if body.structured_outputs is not None:
        found += _structured(body.structured_outputs)
    return found


def _structured(so: StructuredOutputs) -> list[tuple[str, Any]]:
    asked = [
        ("structured_outputs.json", so.json_),
        ("structured_outputs.regex", so.regex),
        ("structured_outputs.choice", so.choice),
        ("structured_outputs.grammar", so.grammar),
        ("structured_outputs.json_object", {} if so.json_object else None),
    ]
    if not any(value is not None for _, value in asked):
        raise errors.invalid("structured_outputs asks for nothing", "structured_outputs")
    return asked


def _grammar(param: str, value: Any) -> str:
    kind = param.rsplit(".", 1)[-1].removeprefix("guided_")
    if kind in ("json", "json_object", "response_format"):
        return _json_grammar(param, value)
    if kind == "regex":
        return regex_grammar(value)
    if kind == "choice":
        if not value or len(value) > MAX_CHOICES:
            raise errors.invalid(f"{param} must list 1 to {MAX_CHOICES} strings", param)
        return choice_grammar(value)
    return lark_grammar(value)


def _json_grammar(param: str, schema: Any) -> str:
    """The empty schema (``json_object``, or ``json_schema`` without one) means any object."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise errors.invalid(f"{param} must be a JSON schema", param) from None
    if not isinstance(schema, dict):
        raise errors.invalid(f"{param} must be a JSON schema object", param)
    if not schema:
        return any_json_object_grammar()
    try:
        return json_schema_grammar(schema)
    except ValueError as exc:
        raise errors.invalid(f"{param} is not a valid JSON schema: {exc}", param) from exc
