"""Heavy requests against a real gateway on loopback: a grammar too costly to compile is a 400
before any node sees it, and one tenant at its share of sequences or KV tokens gets 429 while
another tenant is served."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import gateway_settings
from tests.support.fake_engine import FakeEngine
from tests.support.gateway import ServedGateway
from tests.support.loop import BackgroundLoop
from tests.support.wait import wait_until

BOMB = "(a{1000}){1000}"
ALPHA = {"Authorization": "Bearer sk-alpha"}
BETA = {"Authorization": "Bearer sk-beta"}


def completion(http: httpx.Client, model: str, headers: dict[str, str] | None = None,
               **fields: Any) -> httpx.Response:  # fmt: skip
    body = {"model": model, "prompt": "Hi", "max_tokens": 4} | fields
    return http.post("/v1/completions", json=body, headers=headers or {})


def test_a_costly_regex_is_a_400_in_openai_shape(http: httpx.Client, model_name: str) -> None:
    for _ in range(2):  # the second time from the remembered verdict
        asked = time.monotonic()
        answer = completion(http, model_name, guided_regex=BOMB)
        assert time.monotonic() - asked < 2.0
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["param"] == "guided_regex"
        assert "too complex" in error["message"]


def test_a_costly_pattern_deep_in_a_json_schema_is_a_400(
    http: httpx.Client, model_name: str
) -> None:
    # The schema's first token mask never reaches the pattern; a node would, later.
    inner = {"type": "object", "properties": {"id": {"type": "string", "pattern": BOMB}}}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": inner}}
    asked = time.monotonic()
    answer = completion(http, model_name, guided_json=schema)
    assert time.monotonic() - asked < 2.0
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "guided_json"


def test_a_forced_tool_call_with_a_costly_schema_is_a_400(
    http: httpx.Client, model_name: str
) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": BOMB}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    body = {
        "model": model_name, "messages": [{"role": "user", "content": "Hi"}],
        "tools": [tool], "tool_choice": "required", "max_tokens": 4,
    }  # fmt: skip
    asked = time.monotonic()
    answer = http.post("/v1/chat/completions", json=body)
    assert time.monotonic() - asked < 2.0
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "tools"


def test_a_cheap_grammar_still_passes(http: httpx.Client, model_name: str) -> None:
    answer = completion(http, model_name, guided_regex=r"[a-z]{1,8}@[a-z]{1,8}\.com")
    assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def shared_gateway(
    bg_loop: BackgroundLoop, nats_url: str, cache_dir: Path, fake_engine: FakeEngine
) -> Iterator[ServedGateway]:
    settings = gateway_settings(
        nats_url, cache_dir, api_keys="sk-alpha:tenant-a,sk-beta:tenant-b",
        max_sequences_per_tenant=2, max_kv_tokens_per_tenant=4000,
        tenant_max_kv_tokens="tenant-b=100000",
    )  # fmt: skip
    served = ServedGateway(bg_loop, settings).start()
    yield served
    served.stop()


@contextmanager
def slow_stream(
    client: httpx.Client, model: str, headers: dict[str, str], n: int
) -> Iterator[None]:
    """A streaming request that holds ``n`` sequences until the block ends."""
    body = {"model": model, "prompt": "[[slow]]", "max_tokens": 500, "n": n, "stream": True}
    with client.stream("POST", "/v1/completions", json=body, headers=headers) as response:
        assert response.status_code == 200, response.read()
        # Kept referenced: dropping the iterator would close the connection, and the stream.
        events = response.iter_bytes()
        next(events)  # the first event: the request is in flight
        yield


def test_a_tenant_at_its_sequence_cap_gets_429_while_another_is_served(
    shared_gateway: ServedGateway, model_name: str
) -> None:
    with httpx.Client(base_url=shared_gateway.url, timeout=15) as client:
        with slow_stream(client, model_name, ALPHA, n=2):
            refused = completion(client, model_name, ALPHA)
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
            assert "2 of 2 sequences" in error["message"]
            assert int(refused.headers["retry-after"]) >= 1
            served = completion(client, model_name, BETA, n=2)
            assert served.status_code == 200, served.text
        # Its share comes back when its stream ends.
        answers: list[httpx.Response] = []

        def share_back() -> bool:
            answers.append(completion(client, model_name, ALPHA))
            return answers[-1].status_code != 429

        wait_until(share_back, "the tenant's share to come back")
        assert answers[-1].status_code == 200, answers[-1].text


def test_a_tenant_at_its_kv_token_cap_gets_429(
    shared_gateway: ServedGateway, model_name: str
) -> None:
    client = httpx.Client(base_url=shared_gateway.url, timeout=15)
    with client, slow_stream(client, model_name, ALPHA, n=1):  # reserves its prompt plus 500
        refused = completion(client, model_name, ALPHA, max_tokens=3600)
        assert refused.status_code == 429, refused.text
        assert "KV tokens" in refused.json()["error"]["message"]
        assert "retry-after" in refused.headers
        # tenant-b's own cap is larger.
        assert completion(client, model_name, BETA, max_tokens=3600).status_code == 200


def test_a_request_over_what_a_tenant_may_ever_hold_is_a_400(
    shared_gateway: ServedGateway, model_name: str
) -> None:
    with httpx.Client(base_url=shared_gateway.url, timeout=15) as client:
        too_many = completion(client, model_name, ALPHA, n=3)
        assert too_many.status_code == 400, too_many.text
        assert too_many.json()["error"]["param"] == "n"
        too_long = completion(client, model_name, ALPHA, n=2, max_tokens=3000)
        assert too_long.status_code == 400, too_long.text
        assert "your limit is 4000" in too_long.json()["error"]["message"]
