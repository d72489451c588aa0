"""The global KV cache end to end: two prefill nodes, one decode node, cachemeta on a real
Postgres database, the cost-based scheduler, and the openai client.

cachemeta runs as its own process here (not under `crescent up`), so the tests can kill it,
restart it, and cut it off from its database while the stack keeps serving.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI

from shared.messages import NodeStatus
from tests.e2e.cachemeta_proc import CacheMetaProcess, catalogue_stats
from tests.e2e.conftest import ALICE_KEY, BOB_KEY, stack_env
from tests.e2e.stack import Stack, collect_logs
from tests.e2e.test_openai_e2e import latest_heartbeats
from tests.support import postgres
from tests.support.nats import NatsServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not postgres.reachable(), reason="no Postgres on 127.0.0.1:5432"),
]


@dataclass
class GlobalStack:
    stack: Stack
    cachemeta: CacheMetaProcess
    database: str
    nats_url: str

    def client(self, key: str = ALICE_KEY) -> OpenAI:
        return OpenAI(base_url=self.stack.base_url, api_key=key, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def gstack(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path, nats_server: NatsServer
) -> Iterator[GlobalStack]:
    with postgres.fresh_database("crescent_e2e") as database:
        cachemeta = CacheMetaProcess.start(
            postgres.sqlalchemy_url(database), tmp_path_factory.mktemp("cachemeta")
        )
        data_dir = tmp_path_factory.mktemp("gstack")
        env = stack_env(cache_dir, nats_server.url, "ucx") | {
            "CRESCENT_CACHEMETA_URL": cachemeta.target,
            "CRESCENT_DB_URL": postgres.sqlalchemy_url(database),
        }
        stack = Stack.start(data_dir, env, extra_args=["--prefill", "2"])
        try:
            yield GlobalStack(stack, cachemeta, database, nats_server.url)
        finally:
            status = stack.stop()
            cachemeta.stop()
        assert status == 0, collect_logs(data_dir)


@dataclass
class Answer:
    text: str
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


def ask(client: OpenAI, prompt: str, max_tokens: int = 8) -> Answer:
    """Streams a greedy completion; TTFT is measured to the first chunk with text."""
    started = time.perf_counter()
    stream = client.completions.create(
        model=client.models.list().data[0].id,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    ttft, parts, usage = None, [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            ttft = ttft or time.perf_counter() - started
            parts.append(chunk.choices[0].text)
        usage = chunk.usage or usage
    assert ttft is not None and usage is not None
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Answer("".join(parts), ttft, usage.prompt_tokens, cached)


def document(topic: str, lines: int) -> str:
    return " ".join(f"Note {i} on {topic}: entry {i * 7 % 13} of the ledger." for i in range(lines))


def prefill_counters(nats_url: str) -> dict[str, NodeStatus]:
    beats = asyncio.run(latest_heartbeats(nats_url))
    return {k: v for k, v in beats.items() if v.role == "prefill"}


def wait_catalogued(gs: GlobalStack, min_replicas: int, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = catalogue_stats(gs.cachemeta.target)
        if stats is not None and stats.num_replicas >= min_replicas:
            return
        time.sleep(0.2)
    raise AssertionError(f"cachemeta never held {min_replicas} replicas")


def test_a_long_prompt_asked_again_comes_from_the_cache(gstack: GlobalStack) -> None:
    client = gstack.client()
    prompt = document("rivers", 110)
    cold = ask(client, prompt)
    assert cold.prompt_tokens > 1500 and cold.cached_tokens == 0
    wait_catalogued(gstack, cold.prompt_tokens // 32)
    warm = ask(client, prompt)
    assert warm.text == cold.text
    assert warm.cached_tokens >= 0.9 * warm.prompt_tokens
    assert cold.ttft_s >= 5 * warm.ttft_s, (cold.ttft_s, warm.ttft_s)


def test_a_prefix_cached_on_a_busy_node_is_pulled_by_the_other(gstack: GlobalStack) -> None:
    client = gstack.client()
    shared = document("mountains", 50)
    ask(client, shared, max_tokens=1)
    before = prefill_counters(gstack.nats_url)
    wait_catalogued(gstack, 25)
    # Extending the cached prefix sends this long request to the node holding it, which
    # stays busy computing the extension ...
    busy = client.completions.create(
        model=client.models.list().data[0].id,
        prompt=shared + " " + document("glaciers", 90),
        max_tokens=1,
        temperature=0,
        stream=True,
    )
    time.sleep(0.3)  # placed and computing; its first token is still far off
    # ... so the next request on the same prefix is cheaper on the idle node, which pulls it.
    question = shared + " Which note mentions entry 5?"
    pulled = ask(client, question)
    for _ in busy:
        pass
    after = prefill_counters(gstack.nats_url)
    received = {n: after[n].kv_bytes_received - before[n].kv_bytes_received for n in after}
    puller = max(received, key=lambda n: received[n])
    assert received[puller] > 0, received
    assert pulled.cached_tokens >= pulled.prompt_tokens - 64
    reference = ask(gstack.client(BOB_KEY), question)  # another tenant: computed cold
    assert reference.cached_tokens == 0 and reference.text == pulled.text


def test_cachemeta_restart_and_database_outage_fail_no_request(gstack: GlobalStack) -> None:
    client = gstack.client()
    prompt = document("harbours", 70)
    cold = ask(client, prompt)
    wait_catalogued(gstack, cold.prompt_tokens // 32)

    gstack.cachemeta.kill()
    assert ask(client, document("deserts", 20)).text  # served cache-obliviously meanwhile
    gstack.cachemeta.restart()
    stats = catalogue_stats(gstack.cachemeta.target)
    assert stats is not None and stats.num_replicas >= cold.prompt_tokens // 32
    hit = ask(client, prompt)
    assert hit.cached_tokens >= 0.9 * hit.prompt_tokens and hit.text == cold.text

    postgres.cut_off(gstack.database)
    try:
        during = ask(client, document("forests", 60))
        assert during.text
    finally:
        postgres.restore(gstack.database)
    time.sleep(2)  # the nodes resync their blocks once writes work again
    again = ask(client, document("forests", 60))
    assert again.cached_tokens >= 0.9 * again.prompt_tokens and again.text == during.text


def test_tenants_never_share_the_global_cache(gstack: GlobalStack) -> None:
    prompt = document("islands", 60)
    alice, bob = gstack.client(ALICE_KEY), gstack.client(BOB_KEY)
    assert ask(alice, prompt).cached_tokens == 0
    assert ask(alice, prompt).cached_tokens > 500
    assert ask(bob, prompt).cached_tokens == 0
