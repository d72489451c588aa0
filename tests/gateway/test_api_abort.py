"""Cancellation reaches the backend (client gone, stop string matched), and a lost NATS
connection turns into 503s until it comes back."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from shared.model.tokenizer import Tokenizer
from tests.gateway.conftest import gateway_settings
from tests.support.fake_engine import FakeEngine
from tests.support.gateway import ServedGateway
from tests.support.loop import BackgroundLoop
from tests.support.nats import NatsServer
from tests.support.wait import wait_until

SLOW = [{"role": "user", "content": "Take your time [[slow]]"}]


def in_flight(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("crescent_gateway_requests_in_flight "):
            return float(line.split()[1])
    raise AssertionError("no in-flight gauge")


def test_client_disconnect_mid_stream_aborts(
    gateway: ServedGateway, model_name: str, fake_engine: FakeEngine, http: httpx.Client
) -> None:
    body = {"model": model_name, "messages": SLOW, "stream": True}
    with (
        httpx.Client(base_url=gateway.url, timeout=15) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        events = []
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            if len(events) == 4:
                break
    request_id = f"{events[0]['id']}-0"
    wait_until(lambda: request_id in fake_engine.aborts, "the abort")
    wait_until(lambda: in_flight(http) == 0, "no request in flight")


def test_client_giving_up_on_a_plain_request_aborts(
    gateway: ServedGateway, model_name: str, fake_engine: FakeEngine, http: httpx.Client
) -> None:
    with (
        httpx.Client(base_url=gateway.url, timeout=0.5) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/v1/chat/completions", json={"model": model_name, "messages": SLOW})
    request_id = fake_engine.requests[-1].request_id
    wait_until(lambda: request_id in fake_engine.aborts, "the abort")
    wait_until(lambda: in_flight(http) == 0, "no request in flight")


def test_stop_string_match_aborts_the_rest(
    http: httpx.Client, model_name: str, fake_engine: FakeEngine
) -> None:
    body = {"model": model_name, "prompt": "[[slow]]", "stop": ["wörld"], "max_tokens": 500}
    response = http.post("/v1/completions", json=body)
    assert response.json()["choices"][0]["text"] == "Hello! Crescent says héllo "
    request_id = f"{response.json()['id']}-0"
    wait_until(lambda: request_id in fake_engine.aborts, "the abort")


def test_lost_nats_is_503_until_it_returns(
    bg_loop: BackgroundLoop, tmp_path: Path, cache_dir: Path, tokenizer: Tokenizer, model_name: str
) -> None:
    server = NatsServer.start(tmp_path, jetstream=False)
    engine = FakeEngine(tokenizer)
    bg_loop.run(engine.start(server.url))
    gateway = ServedGateway(bg_loop, gateway_settings(server.url, cache_dir)).start()
    body = {"model": model_name, "messages": [{"role": "user", "content": "Hi"}]}
    try:
        with httpx.Client(base_url=gateway.url, timeout=15) as http:
            assert http.post("/v1/chat/completions", json=body).status_code == 200
            server.stop()
            wait_until(lambda: http.get("/health").status_code == 503, "health 503")
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 503
            assert response.json()["error"]["type"] == "service_unavailable"
            server = NatsServer.start(tmp_path, port=server.port, jetstream=False)
            wait_until(lambda: http.get("/health").status_code == 200, "health 200")
            wait_until(
                lambda: http.post("/v1/chat/completions", json=body).status_code == 200,
                "a request served again",
            )
    finally:
        gateway.stop()
        bg_loop.run(engine.stop())
        server.stop()


def test_request_timeout_aborts_and_reports(
    bg_loop: BackgroundLoop,
    nats_url: str,
    cache_dir: Path,
    fake_engine: FakeEngine,
    model_name: str,
) -> None:
    settings = gateway_settings(nats_url, cache_dir, request_timeout_s=0.5)
    gateway = ServedGateway(bg_loop, settings).start()
    body = {"model": model_name, "messages": SLOW}
    try:
        with httpx.Client(base_url=gateway.url, timeout=15) as http:
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 504
            assert response.json()["error"]["code"] == "timeout"
            request_id = fake_engine.requests[-1].request_id
            wait_until(lambda: request_id in fake_engine.aborts, "the abort")
            with http.stream(
                "POST", "/v1/chat/completions", json=body | {"stream": True}
            ) as stream:
                events = [x[6:] for x in stream.iter_lines() if x.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert json.loads(events[-2])["error"]["code"] == "timeout"
            request_id = fake_engine.requests[-1].request_id
            wait_until(lambda: request_id in fake_engine.aborts, "the abort")
    finally:
        gateway.stop()
