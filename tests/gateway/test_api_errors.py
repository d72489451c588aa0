"""Every error status in OpenAI's shape, and the gateway still answering after each one."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from shared.messages import PREDICTED_TTFT_MARGIN
from tests.gateway.conftest import FIRST_TOKEN_TIMEOUT_S
from tests.support.fake_engine import REPLY, FakeEngine
from tests.support.gateway import ServedGateway
from tests.support.wait import wait_until

HELLO: Any = [{"role": "user", "content": "Hello"}]


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if param is not None:
        assert body["error"]["param"] == param
    return body["error"]


def still_serving(http: httpx.Client, model: str) -> None:
    response = http.post("/v1/chat/completions", json={"model": model, "messages": HELLO})
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == REPLY


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": HELLO, "bogus": 1}, "bogus"),
        (
            {"messages": HELLO, "tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        ({"messages": HELLO, "temperature": 5}, "temperature"),
        ({"messages": HELLO, "n": "two"}, "n"),
        ({"messages": HELLO, "max_tokens": 9000}, "max_tokens"),
        ({"messages": HELLO, "max_tokens": 8190}, "messages"),
        ({"messages": HELLO, "presence_penalty": 3}, "presence_penalty"),
        ({"messages": "hi"}, "messages"),
        ({}, "messages"),
    ],
)
def test_bad_chat_requests_are_400(
    http: httpx.Client, model_name: str, body: dict[str, Any], param: str
) -> None:
    response = http.post("/v1/chat/completions", json={"model": model_name} | body)
    error = assert_openai_error(response, 400, param)
    assert error["type"] == "invalid_request_error"
    still_serving(http, model_name)


def test_context_length_error_says_the_numbers(http: httpx.Client, model_name: str) -> None:
    body = {"model": model_name, "prompt": [1] * 8000, "max_tokens": 500}
    error = assert_openai_error(http.post("/v1/completions", json=body), 400, "prompt")
    assert "maximum context length is 8192 tokens" in error["message"]
    assert "requested 8500 tokens (8000 in the prompt, 500 for the completion)" in error["message"]


@pytest.mark.parametrize(
    "body",
    [{"echo": True}, {"best_of": 2}, {"suffix": "x"}, {"logit_bias": {"1": 500}}, {"logprobs": 50}],
)
def test_unsupported_completion_parameters_are_named(
    http: httpx.Client, model_name: str, body: dict[str, Any]
) -> None:
    response = http.post("/v1/completions", json={"model": model_name, "prompt": "x"} | body)
    assert_openai_error(response, 400, next(iter(body)))


def test_malformed_bodies_are_400(http: httpx.Client, model_name: str) -> None:
    headers = {"content-type": "application/json"}
    for raw in (b"{not json", b"[1, 2]", b"", "\u00ff".encode("latin-1")):
        response = http.post("/v1/chat/completions", content=raw, headers=headers)
        assert_openai_error(response, 400)
    still_serving(http, model_name)


def test_openai_client_sees_bad_request(client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=HELLO, top_logprobs=3)
    assert info.value.status_code == 400
    assert info.value.body is not None and info.value.body["param"] == "top_logprobs"  # type: ignore[index]


def test_unknown_model_and_route_are_404(
    http: httpx.Client, client: openai.OpenAI, model_name: str
) -> None:
    response = http.post("/v1/chat/completions", json={"model": "gpt-9", "messages": HELLO})
    assert assert_openai_error(response, 404, "model")["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    assert_openai_error(http.post("/v1/embeddings", json={}), 404)
    assert_openai_error(http.get("/nowhere"), 404)
    assert_openai_error(http.get("/v1/chat/completions"), 405)
    still_serving(http, model_name)


def test_oversized_body_is_413(http: httpx.Client, model_name: str) -> None:
    body = b'{"model": "m", "prompt": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    response = http.post(
        "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert_openai_error(response, 413)

    def chunked() -> Any:
        for _ in range(5):
            yield b"x" * (1024 * 1024)

    response = http.post("/v1/completions", content=chunked())
    assert_openai_error(response, 413)
    still_serving(http, model_name)


def test_api_keys_are_checked(
    keyed_gateway: ServedGateway, fake_engine: FakeEngine, model_name: str
) -> None:
    model = model_name
    with httpx.Client(base_url=keyed_gateway.url, timeout=15) as http:
        body = {"model": model, "messages": HELLO}
        for headers in ({}, {"authorization": "Bearer sk-wrong"}, {"authorization": "sk-alpha"}):
            response = http.post("/v1/chat/completions", json=body, headers=headers)
            assert_openai_error(response, 401)
        assert_openai_error(http.get("/v1/models"), 401)
        assert http.get("/health").status_code == 200
    with openai.OpenAI(base_url=f"{keyed_gateway.url}/v1", api_key="sk-beta", max_retries=0) as c:
        completion = c.chat.completions.create(model=model, messages=HELLO)
        request = fake_engine.request(f"{completion.id}-0")
        assert request is not None and request.tenant == "tenant-b"
    with (
        openai.OpenAI(base_url=f"{keyed_gateway.url}/v1", api_key="nope", max_retries=0) as c,
        pytest.raises(openai.AuthenticationError),
    ):
        c.models.list()


@pytest.mark.parametrize("stream", [False, True])
def test_backend_429_passes_through_with_retry_after(
    http: httpx.Client, model_name: str, stream: bool
) -> None:
    messages = [{"role": "user", "content": "[[429]]"}]
    body = {"model": model_name, "messages": messages, "stream": stream}
    response = http.post("/v1/chat/completions", json=body)
    error = assert_openai_error(response, 429)
    assert error["code"] == "rate_limit_exceeded"
    assert response.headers["retry-after"] == "3"
    still_serving(http, model_name)


def test_openai_client_sees_429(client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model=model_name, prompt="[[429]]")


def test_backend_503_passes_through(http: httpx.Client, model_name: str) -> None:
    body = {"model": model_name, "prompt": "[[503]]"}
    assert_openai_error(http.post("/v1/completions", json=body), 503)
    still_serving(http, model_name)


def test_no_first_token_in_time_is_504_and_aborted(
    http: httpx.Client, model_name: str, fake_engine: FakeEngine
) -> None:
    started = time.monotonic()
    body = {"model": model_name, "prompt": "[[silent]]", "n": 2}
    error = assert_openai_error(http.post("/v1/completions", json=body), 504)
    assert error["message"].startswith("No first token came within")
    assert FIRST_TOKEN_TIMEOUT_S <= time.monotonic() - started < FIRST_TOKEN_TIMEOUT_S + 5
    # The two choices of this request are the last requests the engine received.
    recent = fake_engine.requests[-2:]
    assert [r.request_id[-2:] for r in recent] == ["-0", "-1"]
    wait_until(
        lambda: all(r.request_id in fake_engine.aborts for r in recent), "both choices aborted"
    )
    still_serving(http, model_name)


def test_the_first_token_timeout_counts_from_the_predicted_ttft(
    http: httpx.Client, model_name: str
) -> None:
    """A slow model's long prompt, predicted by the scheduler to take 1 s, answers after 2 s:
    past the 1.5 s timeout, within it plus twice the prediction (3.5 s). Silent, it gets its
    504 only then."""
    late = {"model": model_name, "prompt": "[[late=2]][[predicted=1]]", "max_tokens": 4}
    started = time.monotonic()
    response = http.post("/v1/completions", json=late)
    assert response.status_code == 200, response.text
    assert time.monotonic() - started >= 2.0
    silent = {"model": model_name, "prompt": "[[silent]][[predicted=1]]"}
    started = time.monotonic()
    error = assert_openai_error(http.post("/v1/completions", json=silent), 504)
    assert error["message"].startswith("No first token came within")
    extended = FIRST_TOKEN_TIMEOUT_S + PREDICTED_TTFT_MARGIN * 1.0
    assert extended <= time.monotonic() - started < extended + 5


def test_backend_failing_mid_request(
    http: httpx.Client, client: openai.OpenAI, model_name: str
) -> None:
    messages: Any = [{"role": "user", "content": "[[fail]]"}]
    body = {"model": model_name, "messages": messages}
    error = assert_openai_error(http.post("/v1/chat/completions", json=body), 503)
    assert error["message"] == "the decode node was lost"
    with http.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["message"] == "the decode node was lost"
    with pytest.raises(openai.APIError, match="decode node was lost"):
        for _ in client.chat.completions.create(model=model_name, messages=messages, stream=True):
            pass
    still_serving(http, model_name)
