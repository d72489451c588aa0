"""The scheduler service over a real NATS server, with a fake cachemeta client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from services.scheduler.config import SchedulerSettings
from services.scheduler.lookup import HashScope, prompt_block_hashes
from services.scheduler.main import SchedulerService
from shared import subjects
from shared.bus import Bus
from shared.cluster_messages import NodeStatus, PrefillTask, PullPlan
from shared.messages import GenerateRequest, SamplingSpec, TokenChunk
from shared.rpc.client import CacheMetaUnavailable
from shared.rpc.types import PrefixHolder
from tests.scheduler.fake_cachemeta import FakeCacheMeta
from tests.support.nats import nats_url as running_nats

SECRET = "test-secret"
SCOPE = HashScope("smollm2-test", 32, "float32")
PROMPT = [(7 * i) % 1000 for i in range(2000)]  # 62 cacheable blocks
WAIT_S = 5.0


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_nats(tmp_path_factory.mktemp("nats")) as url:
        yield url


def beat(node_id: str, role: str, **load: Any) -> NodeStatus:
    return NodeStatus(
        node_id=node_id,
        role=role,
        free_blocks=1000,
        total_blocks=1000,
        block_size=SCOPE.block_size,
        model_id=SCOPE.model_id,
        kv_dtype=SCOPE.kv_dtype,
        block_bytes=32 * 46_080,
        **load,
    )


def generate(request_id: str, prompt: list[int] = PROMPT) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id,
        tenant="tenant-a",
        prompt_token_ids=prompt,
        sampling=SamplingSpec(max_tokens=8),
    )


class Harness:
    """A scheduler service and a client connection that plays the nodes and the gateway."""

    def __init__(self, service: SchedulerService, bus: Bus) -> None:
        self.service = service
        self.bus = bus
        self.tasks: asyncio.Queue[tuple[str, PrefillTask]] = asyncio.Queue()
        self.chunks: asyncio.Queue[TokenChunk] = asyncio.Queue()

    async def nodes(self, *beats: NodeStatus) -> None:
        for status in beats:
            if status.role == "prefill":
                await self._collect_tasks(status.node_id)
            await self.bus.publish(subjects.HEARTBEATS, status)
        handlers = self.service.handlers
        assert handlers is not None
        deadline = time.monotonic() + WAIT_S
        while len(handlers.view.nodes) < len(beats):
            assert time.monotonic() < deadline, "heartbeats did not arrive"
            await asyncio.sleep(0.01)

    async def send(self, request: GenerateRequest) -> None:
        await self.bus.subscribe(subjects.tokens(request.request_id), TokenChunk, self.chunks.put)
        await self.bus.flush()
        await self.bus.publish(subjects.REQUESTS, request)

    async def next_task(self) -> tuple[str, PrefillTask]:
        return await asyncio.wait_for(self.tasks.get(), WAIT_S)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        assert self.service.metrics is not None
        return self.service.metrics.registry.get_sample_value(name, labels or {}) or 0.0

    def fallbacks(self, reason: str) -> float:
        return self.sample("crescent_cachemeta_fallbacks_total", {"reason": reason})

    async def _collect_tasks(self, node_id: str) -> None:
        async def put(task: PrefillTask) -> None:
            await self.tasks.put((node_id, task))

        await self.bus.subscribe(subjects.prefill_tasks(node_id), PrefillTask, put)


@asynccontextmanager
async def scheduler(
    url: str, index: FakeCacheMeta | None, **settings: Any
) -> AsyncIterator[Harness]:
    config = SchedulerSettings(nats_url=url, cache_secret=SECRET, **settings)
    service = SchedulerService(config, index=index)
    await service.start()
    bus = await Bus.connect(url, "test-nodes")
    try:
        yield Harness(service, bus)
    finally:
        await bus.close()
        await service.stop()


# A holds the whole prompt but has a long queue; B is idle: B should pull the blocks from A.
LOAD_FORCED = (
    beat("A", "prefill", queued_tokens=20_000),
    beat("B", "prefill"),
    beat("D", "decode"),
)
# A holds the prompt and is nearly idle, B is idle but cannot pull from A: with the cache in
# view A wins; placed without it, B (the least loaded) does.
CACHE_DECIDES = (
    beat("A", "prefill", queued_tokens=100),
    beat("B", "prefill", fetch_bandwidth={"A": 1e6}),
    beat("D", "decode"),
)


def test_a_prompt_cached_on_a_busy_node_is_pulled_from_it(nats_url: str) -> None:
    async def scenario() -> None:
        index = FakeCacheMeta([PrefixHolder("A", "dram", 62), PrefixHolder("A", "disk", 62)])
        async with scheduler(nats_url, index) as h:
            await h.nodes(*LOAD_FORCED)
            await h.send(generate("r-pull"))
            node, task = await h.next_task()
            assert node == "B" and task.decode_node == "D"
            assert task.pulls == [PullPlan(node_id="A", first_block=0, num_blocks=62)]
            assert 0 < task.predicted_ttft_s < 1
            hashes = prompt_block_hashes(PROMPT, SCOPE, SECRET, "tenant-a")
            assert index.matches == [hashes] and index.timeouts == [0.1]
            await asyncio.sleep(0.2)  # touches go out in batches every 0.1 s
            assert index.touches == [hashes]
            assert h.sample("crescent_placements_total") == 1
            assert h.sample("crescent_placed_cached_tokens_total") == 62 * 32
            assert h.sample("crescent_planned_pull_blocks_total") == 62

    asyncio.run(scenario())


def test_with_the_cache_in_view_the_holder_wins(nats_url: str) -> None:
    async def scenario() -> None:
        async with scheduler(nats_url, FakeCacheMeta([PrefixHolder("A", "dram", 62)])) as h:
            await h.nodes(*CACHE_DECIDES)
            await h.send(generate("r-local"))
            node, task = await h.next_task()
            assert (node, task.pulls) == ("A", [])

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("index", "reason"),
    [
        (FakeCacheMeta(error=CacheMetaUnavailable("database down")), "CacheMetaUnavailable"),
        (FakeCacheMeta([PrefixHolder("A", "dram", 62)], delay_s=10), "timeout"),
        (None, "unconfigured"),
    ],
)
def test_without_cachemeta_requests_are_placed_cache_obliviously(
    nats_url: str, index: FakeCacheMeta | None, reason: str
) -> None:
    async def scenario() -> None:
        async with scheduler(nats_url, index) as h:
            await h.nodes(*CACHE_DECIDES)
            # The first lookup fails, the next ones back off; each request goes to the least
            # loaded node, counting what was placed before it (with the cache, all go to A).
            for i, want in enumerate("BAB"):
                await h.send(generate(f"r-oblivious-{reason}-{i}"))
                node, task = await h.next_task()
                assert (node, task.pulls) == (want, [])
            assert h.fallbacks(reason) >= 1
            assert h.chunks.empty()  # no request failed

    asyncio.run(scenario())


def test_concurrent_requests_each_see_the_ones_placed_before(nats_url: str) -> None:
    async def scenario() -> None:
        async with scheduler(nats_url, FakeCacheMeta(delay_s=0.05)) as h:
            await h.nodes(beat("A", "prefill"), beat("B", "prefill"), beat("D", "decode"))
            for i in range(2):
                await h.send(generate(f"r-concurrent-{i}"))
            placed = {(await h.next_task())[0] for _ in range(2)}
            assert placed == {"A", "B"}

    asyncio.run(scenario())


def test_the_round_robin_baseline_ignores_caches(nats_url: str) -> None:
    async def scenario() -> None:
        index = FakeCacheMeta([PrefixHolder("A", "dram", 62)])
        async with scheduler(nats_url, index, placement="round_robin") as h:
            await h.nodes(*CACHE_DECIDES)
            nodes = []
            for i in range(4):
                await h.send(generate(f"r-rr-{i}"))
                node, task = await h.next_task()
                assert task.pulls == []
                nodes.append(node)
            assert sorted(nodes) == ["A", "A", "B", "B"] and nodes[0] != nodes[1]
            assert index.matches == [] and h.fallbacks("unconfigured") == 0

    asyncio.run(scenario())


def test_a_request_over_the_slo_is_rejected_with_429_and_retry_after(nats_url: str) -> None:
    async def scenario() -> None:
        async with scheduler(nats_url, FakeCacheMeta(), ttft_slo_ms=50) as h:
            await h.nodes(beat("A", "prefill", queued_tokens=8192), beat("D", "decode"))
            await h.send(generate("r-slo"))
            chunk = await asyncio.wait_for(h.chunks.get(), WAIT_S)
            assert chunk.error_code == 429 and chunk.error and "objective" in chunk.error
            assert chunk.retry_after_s is not None and chunk.retry_after_s >= 1
            assert h.tasks.empty()
            assert h.sample("crescent_rejections_total", {"cause": "ttft_slo"}) == 1

    asyncio.run(scenario())


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRESCENT_TTFT_SLO_MS", "250")
    monkeypatch.setenv("CRESCENT_CACHEMETA_URL", "127.0.0.1:50051")
    monkeypatch.setenv("CRESCENT_MAX_NUM_BATCHED_TOKENS", "512")
    monkeypatch.delenv("CRESCENT_CACHE_SECRET", raising=False)
    settings = SchedulerSettings()
    assert settings.ttft_slo_s == 0.25 and settings.cachemeta_url == "127.0.0.1:50051"
    assert settings.cost_params().max_num_batched_tokens == 512
    assert settings.cache_secret == "crescent-dev-cache-secret"  # the nodes' default
