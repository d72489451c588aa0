"""Gateway fixtures: a real NATS server, the fake engine on it, and served gateways."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from services.gateway.config import GatewaySettings
from shared.model.tokenizer import Tokenizer
from tests.support.fake_engine import FakeEngine
from tests.support.gateway import ServedGateway
from tests.support.loop import BackgroundLoop
from tests.support.nats import nats_url as running_nats

API_KEYS = "sk-alpha:tenant-a,sk-beta:tenant-b"
# Short enough that the "nobody answers" test is quick, long enough for a loaded CI machine.
FIRST_TOKEN_TIMEOUT_S = 1.5


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_nats(tmp_path_factory.mktemp("nats")) as url:
        yield url


@pytest.fixture(scope="session")
def bg_loop() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="session")
def fake_engine(
    bg_loop: BackgroundLoop, nats_url: str, tokenizer: Tokenizer
) -> Iterator[FakeEngine]:
    engine = FakeEngine(tokenizer)
    bg_loop.run(engine.start(nats_url))
    yield engine
    bg_loop.run(engine.stop())


def gateway_settings(nats_url: str, cache_dir: Path, **overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "nats_url": nats_url,
        "cache_dir": cache_dir,
        "model": None,
        "served_model_name": None,
        "api_keys": "",
        "max_model_len": None,
        "first_token_timeout_s": FIRST_TOKEN_TIMEOUT_S,
        "request_timeout_s": 20.0,
        "nats_connect_timeout_s": 10.0,
    }
    return GatewaySettings(**(values | overrides))


@pytest.fixture(scope="session")
def gateway(
    bg_loop: BackgroundLoop, nats_url: str, cache_dir: Path, fake_engine: FakeEngine
) -> Iterator[ServedGateway]:
    served = ServedGateway(bg_loop, gateway_settings(nats_url, cache_dir)).start()
    yield served
    served.stop()


@pytest.fixture(scope="session")
def keyed_gateway(
    bg_loop: BackgroundLoop, nats_url: str, cache_dir: Path, fake_engine: FakeEngine
) -> Iterator[ServedGateway]:
    settings = gateway_settings(nats_url, cache_dir, api_keys=API_KEYS)
    served = ServedGateway(bg_loop, settings).start()
    yield served
    served.stop()


@pytest.fixture(scope="session")
def model_name(gateway: ServedGateway) -> str:
    assert gateway.service.gateway is not None
    return gateway.service.gateway.builder.model_name


@pytest.fixture
def client(gateway: ServedGateway) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=15
    ) as c:
        yield c


@pytest.fixture
def http(gateway: ServedGateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=15) as c:
        yield c
