"""A scheduler service on the in-memory bus with a fake cachemeta client, and a client that
plays the nodes, tierds and gateways around it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from services.scheduler.config import SchedulerSettings
from services.scheduler.lookup import HashScope
from services.scheduler.main import SchedulerService
from shared import subjects
from shared.cluster_messages import NodeStatus, PrefetchRequest, PrefillTask, TaskAck
from shared.memory_bus import MemoryBus
from shared.messages import GenerateRequest, SamplingSpec, SubmitReply
from tests.scheduler.fake_cachemeta import FakeCacheMeta

SECRET = "test-secret"
SCOPE = HashScope("smollm2-test", 32, "float32")
PROMPT = [(7 * i) % 1000 for i in range(2000)]  # 62 cacheable blocks
WAIT_S = 5.0


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


def other_prompt(i: int) -> list[int]:
    """A prompt as long as ``PROMPT`` sharing no block with it or with another ``i``'s: the
    scheduler remembers where it placed each prompt, so asking one twice is not cache-blind."""
    return [1000 + i, *PROMPT[1:]]


def generate(request_id: str, prompt: list[int] = PROMPT) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id,
        tenant="tenant-a",
        prompt_token_ids=prompt,
        sampling=SamplingSpec(max_tokens=8),
    )


class Harness:
    """A scheduler service on the in-memory bus, and a client that plays the nodes, tierds and
    the gateway. Prefill nodes accept every task unless listed in ``refusing`` or ``silent``;
    tierds put the prefetches they get in ``prefetches``."""

    def __init__(self, service: SchedulerService, bus: MemoryBus) -> None:
        self.service = service
        self.bus = bus
        self.tasks: asyncio.Queue[tuple[str, PrefillTask]] = asyncio.Queue()
        self.refusing: set[str] = set()
        self.silent: set[str] = set()
        self.prefetches: asyncio.Queue[tuple[str, PrefetchRequest]] = asyncio.Queue()

    async def nodes(self, *beats: NodeStatus) -> None:
        for status in beats:
            if status.role == "prefill":
                await self._serve_tasks(status.node_id)
            elif status.role == "tierd":
                await self._take_prefetches(status.node_id)
            await self.beat(status)
        handlers = self.service.handlers
        assert handlers is not None
        deadline = time.monotonic() + WAIT_S
        while len(handlers.view.nodes) < len(beats):
            assert time.monotonic() < deadline, "heartbeats did not arrive"
            await asyncio.sleep(0.01)

    async def beat(self, status: NodeStatus, subject: str = "") -> None:
        subject = subject or subjects.heartbeats(status.role, status.node_id)
        await self.bus.publish(subject, status)
        await self.bus.settle()

    async def send(self, request: GenerateRequest) -> SubmitReply:
        return await self.bus.request(subjects.REQUESTS, request, SubmitReply, WAIT_S)

    async def next_task(self) -> tuple[str, PrefillTask]:
        return await asyncio.wait_for(self.tasks.get(), WAIT_S)

    def sent(self) -> list[str]:
        """The subjects the scheduler published or requested on, in order."""
        bus = self.service.bus
        assert isinstance(bus, MemoryBus)
        return [subject for subject, _ in bus.published]

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        assert self.service.metrics is not None
        return self.service.metrics.registry.get_sample_value(name, labels or {}) or 0.0

    def fallbacks(self, reason: str) -> float:
        return self.sample("crescent_cachemeta_fallbacks_total", {"reason": reason})

    async def _serve_tasks(self, node_id: str) -> None:
        async def take(task: PrefillTask) -> TaskAck | None:
            if node_id in self.silent:
                return None
            await self.tasks.put((node_id, task))
            refused = node_id in self.refusing
            return TaskAck(accepted=not refused, node_id=node_id, epoch="e",
                           reason="draining" if refused else "")  # fmt: skip

        await self.bus.client().serve(subjects.prefill_tasks(node_id), PrefillTask, take)

    async def _take_prefetches(self, tierd_id: str) -> None:
        async def take(request: PrefetchRequest) -> None:
            await self.prefetches.put((tierd_id, request))

        await self.bus.client().subscribe(subjects.prefetches(tierd_id), PrefetchRequest, take)


@asynccontextmanager
async def scheduler(index: FakeCacheMeta | None, **settings: Any) -> AsyncIterator[Harness]:
    config = SchedulerSettings(cache_secret=SECRET, warmup_s=0, **settings)
    bus = MemoryBus()
    service = SchedulerService(config, index=index, bus=bus.client())
    await service.start()
    try:
        yield Harness(service, bus)
    finally:
        await service.stop()
        await bus.close()
