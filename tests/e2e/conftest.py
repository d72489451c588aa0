"""One `crescent up` per test session, on its own NATS server, reached with the openai client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from tests.e2e import disaggregated as disaggregation
from tests.e2e.stack import Stack, collect_logs
from tests.support.nats import NatsServer
from tests.support.otlp import OtlpReceiver


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer.start(tmp_path_factory.mktemp("nats"))
    yield server
    server.stop()


ALICE_KEY = "key-alice"
BOB_KEY = "key-bob"


def stack_env(cache_dir: Path, nats_url: str, transfer: str) -> dict[str, str]:
    return {
        "CRESCENT_CACHE_DIR": str(cache_dir),
        "CRESCENT_NATS_URL": nats_url,
        "CRESCENT_TRANSFER": transfer,
        "CRESCENT_KV_CACHE_MB": "512",
        "CRESCENT_HEARTBEAT_INTERVAL_S": "0.5",
        "CRESCENT_API_KEYS": f"{ALICE_KEY}:alice,{BOB_KEY}:bob",
        "UCX_NET_DEVICES": "lo",
        "UCX_WARN_UNUSED_ENV_VARS": "n",
    }


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Where the session's stack exports its spans (tests/e2e/test_tracing_e2e.py)."""
    receiver = OtlpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    cache_dir: Path,
    nats_server: NatsServer,
    otlp_receiver: OtlpReceiver,
) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("stack")
    env = stack_env(cache_dir, nats_server.url, "ucx") | otlp_receiver.env()
    running = Stack.start(data_dir, env)
    yield running
    status = running.stop()
    assert status == 0, collect_logs(data_dir)


@pytest.fixture(scope="session")
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key=ALICE_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model_name(client: OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def disaggregated(stack: Stack, model_name: str) -> disaggregation.Disaggregated:
    """One long prompt handed from a prefill node to the decode node, with the nodes' metrics
    around it (tests/e2e/test_metrics_e2e.py and test_tracing_e2e.py look at it)."""
    return disaggregation.run(stack, model_name, ALICE_KEY)
