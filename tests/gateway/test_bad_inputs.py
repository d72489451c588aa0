"""Pathological bodies and values: each is a 400 in OpenAI's shape, and the gateway serves on."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from services.gateway.validation import MAX_INT_DIGITS, MAX_JSON_DEPTH
from tests.gateway.test_api_errors import assert_openai_error, still_serving

JSON = {"content-type": "application/json"}
CHAT = "/v1/chat/completions"
NESTED = f"The JSON body is nested {{}} levels deep; at most {MAX_JSON_DEPTH} are allowed."
UNPARSABLE = "We could not parse the JSON body of your request. Send valid JSON."
SURROGATE = (
    "The JSON body contains a lone UTF-16 surrogate (an escape such as \\ud800 without its "
    "pair), which is not a character."
)


def chat_text(model: str, content: str, **extra: str) -> bytes:
    """A chat body with ``content`` spliced in as raw JSON text (escapes are not re-escaped)."""
    fields = "".join(f', "{k}": {v}' for k, v in extra.items())
    return (
        f'{{"model": "{model}", "messages": [{{"role": "user", "content": {content}}}]{fields}}}'
    ).encode()


def post_raw(http: httpx.Client, body: bytes, path: str = CHAT) -> httpx.Response:
    return http.post(path, content=body, headers=JSON)


def bad(http: httpx.Client, body: bytes, message: str, path: str = CHAT) -> None:
    error = assert_openai_error(post_raw(http, body, path), 400)
    assert error["message"] == message
    assert error["type"] == "invalid_request_error" and error["param"] is None


def nested_part(depth: int) -> str:
    """A text part padded with lists so that the whole chat body nests ``depth`` levels."""
    pad = depth - 5  # body, messages, message, content, part
    return '[{"type": "text", "text": "Hello", "pad": ' + "[" * pad + "]" * pad + "}]"


def test_deep_nesting_is_refused_before_parsing(http: httpx.Client, model_name: str) -> None:
    bad(http, b"[" * 100_000, NESTED.format(100_000))
    bad(http, b"{" * 100_000, NESTED.format(100_000), "/v1/completions")
    bad(http, chat_text(model_name, '"hi"', tools="[" * 5000 + "]" * 5000), NESTED.format(5001))
    tools = '[{"type": "function", "function": ' + '{"a": ' * 70 + "1" + "}" * 70 + "}]"
    bad(http, chat_text(model_name, '"hi"', tools=tools), NESTED.format(73))
    bad(http, chat_text(model_name, nested_part(MAX_JSON_DEPTH + 1)), NESTED.format(65))
    still_serving(http, model_name)


def test_nesting_up_to_the_limit_is_served(http: httpx.Client, model_name: str) -> None:
    response = post_raw(http, chat_text(model_name, nested_part(MAX_JSON_DEPTH)))
    assert response.status_code == 200, response.text
    # Brackets inside strings are text, not nesting.
    response = post_raw(http, chat_text(model_name, json.dumps("[" * 500 + "{" * 500)))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("NaN", "The JSON body contains NaN, which is not a JSON number."),
        ("Infinity", "The JSON body contains Infinity, which is not a JSON number."),
        ("-Infinity", "The JSON body contains -Infinity, which is not a JSON number."),
        ("1e400", "The number 1e400 in the JSON body is too large."),
        ("-1.5e999", "The number -1.5e999 in the JSON body is too large."),
        (
            "9" * 5000,
            f"The JSON body has an integer of more than {MAX_INT_DIGITS} digits.",
        ),
        (
            "-" + "1" * (MAX_INT_DIGITS + 1),
            f"The JSON body has an integer of more than {MAX_INT_DIGITS} digits.",
        ),
    ],
)
def test_numbers_json_does_not_allow_are_refused(
    http: httpx.Client, model_name: str, value: str, message: str
) -> None:
    bad(http, chat_text(model_name, '"hi"', temperature=value), message)
    still_serving(http, model_name)


def test_long_digit_runs_in_strings_and_fractions_are_fine(
    http: httpx.Client, model_name: str
) -> None:
    digits = "7" * (MAX_INT_DIGITS + 10)
    body = chat_text(model_name, f'"{digits}"', temperature=f"0.{digits}")
    assert post_raw(http, body).status_code == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "The request body is empty. Send a JSON object."),
        (b" \r\n\t ", "The request body is empty. Send a JSON object."),
        (b"[1, 2]", "The request body must be a JSON object, not an array."),
        (b'"hello"', "The request body must be a JSON object, not a string."),
        (b"42", "The request body must be a JSON object, not a number."),
        (b"null", "The request body must be a JSON object, not null."),
        (b"true", "The request body must be a JSON object, not a boolean."),
        (b"{not json", UNPARSABLE),
        (b'{"model": "m"', UNPARSABLE),
        (b'{"model": "m"}]]]', UNPARSABLE),
        (b'{"model": "\\"\\"\\', UNPARSABLE),
        (b'{"model": "m\xff\xfe"}', "The request body is not valid UTF-8."),
        (b'{"model": "\xed\xa0\x80"}', "The request body is not valid UTF-8."),
    ],
)
def test_bodies_that_are_not_one_json_object(
    http: httpx.Client, model_name: str, body: bytes, message: str
) -> None:
    bad(http, body, message)
    still_serving(http, model_name)


@pytest.mark.parametrize(
    "body",
    [
        lambda m: chat_text(m, '"a\\ud800b"'),
        lambda m: chat_text(m, '"\\udfff"'),
        lambda m: chat_text(m, '"\\ude00\\ud83d"'),
        lambda m: chat_text(m, '[{"type": "text", "text": "\\uDBFF"}]'),
        lambda m: chat_text(m, '"hi"', stop='["\\ud800"]'),
        lambda m: chat_text(m, '"hi"', cache_salt='"\\ud800"'),
        lambda m: f'{{"model": "{m}", "prompt": "x\\ud800"}}'.encode(),
    ],
)
def test_lone_surrogates_are_refused(http: httpx.Client, model_name: str, body: Any) -> None:
    path = "/v1/completions" if b'"prompt"' in body(model_name) else CHAT
    bad(http, body(model_name), SURROGATE, path)
    still_serving(http, model_name)


def test_surrogate_pairs_and_escaped_backslashes_are_text(
    http: httpx.Client, model_name: str
) -> None:
    for content in ('"smile \\ud83d\\ude00"', '"a literal \\\\ud800"'):
        response = post_raw(http, chat_text(model_name, content))
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {"temperature": 1e-300},
            "temperature",
            "temperature must be 0 (greedy) or between 0.01 and 2, got 1e-300",
        ),
        (
            {"temperature": 1e-45},
            "temperature",
            "temperature must be 0 (greedy) or between 0.01 and 2, got 1e-45",
        ),
        (
            {"temperature": -1},
            "temperature",
            "temperature must be 0 (greedy) or between 0.01 and 2, got -1.0",
        ),
        (
            {"temperature": True},
            "temperature",
            "Invalid value for 'temperature': Input should be a valid number",
        ),
        (
            {"temperature": "0.5"},
            "temperature",
            "Invalid value for 'temperature': Input should be a valid number",
        ),
        ({"top_p": -0.5}, "top_p", "top_p must be in (0, 1], got -0.5"),
        ({"top_p": 1e300}, "top_p", "top_p must be in (0, 1], got 1e+300"),
        (
            {"top_k": 2**40},
            "top_k",
            f"top_k must be -1, 0 or between 1 and {2**31}, got {2**40}",
        ),
        ({"top_k": -5}, "top_k", f"top_k must be -1, 0 or between 1 and {2**31}, got -5"),
        ({"n": True}, "n", "Invalid value for 'n': Input should be a valid integer"),
        ({"n": 10**9}, "n", "n must be between 1 and 16, got 1000000000"),
        (
            {"max_tokens": 10**18},
            "max_tokens",
            f"max_tokens must be at most 8192 (the model's context length), got {10**18}",
        ),
        (
            {"max_completion_tokens": 8193},
            "max_completion_tokens",
            "max_completion_tokens must be at most 8192 (the model's context length), got 8193",
        ),
        ({"max_tokens": -1}, "max_tokens", "max_tokens must be at least 1, got -1"),
        (
            {"max_tokens": 5.0},
            "max_tokens",
            "Invalid value for 'max_tokens': Input should be a valid integer",
        ),
        (
            {"max_tokens": "5"},
            "max_tokens",
            "Invalid value for 'max_tokens': Input should be a valid integer",
        ),
        ({"seed": -1}, "seed", "seed must be a non-negative 63-bit integer, got -1"),
        ({"seed": 2**63}, "seed", f"seed must be a non-negative 63-bit integer, got {2**63}"),
        ({"seed": 10**31}, "seed", f"seed must be a non-negative 63-bit integer, got {10**31}"),
        ({"seed": False}, "seed", "Invalid value for 'seed': Input should be a valid integer"),
        (
            {"logprobs": 1},
            "logprobs",
            "Invalid value for 'logprobs': Input should be a valid boolean",
        ),
        (
            {"logprobs": True, "top_logprobs": 10**6},
            "top_logprobs",
            "top_logprobs must be between 0 and 20, got 1000000",
        ),
        (
            {"stream": "yes"},
            "stream",
            "Invalid value for 'stream': Input should be a valid boolean",
        ),
    ],
)
def test_out_of_range_sampling_values_name_the_parameter(
    http: httpx.Client, model_name: str, fields: dict[str, Any], param: str, message: str
) -> None:
    body = {"model": model_name, "messages": [{"role": "user", "content": "Hello"}]} | fields
    error = assert_openai_error(http.post(CHAT, json=body), 400, param)
    assert error["message"] == message
    still_serving(http, model_name)


def test_edge_values_that_are_valid_are_served(http: httpx.Client, model_name: str) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    for fields in (
        {"temperature": 0.01, "seed": 2**63 - 1, "n": 2},
        {"temperature": 2, "top_k": 10**6},  # beyond the vocabulary: no filter
        {"temperature": 0, "top_p": 1e-300},
        {"max_tokens": 1, "seed": 0},
    ):
        body = {"model": model_name, "messages": messages} | fields
        response = http.post(CHAT, json=body)
        assert response.status_code == 200, (fields, response.text)
