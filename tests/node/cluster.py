"""Prefill and decode services in one process: tiny engines, real TCP block servers, an
in-memory bus, and a stand-in gateway that answers the nodes' checks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.decode.config import DecodeSettings
from services.decode.main import DecodeService
from services.prefill.config import PrefillSettings
from services.prefill.main import PrefillService
from shared import subjects
from shared.cluster_messages import PrefillTask, PullPlan, TaskAck
from shared.engine.engine import LLMEngine
from shared.memory_bus import MemoryBroker, MemoryBus
from shared.messages import (
    GatewayCheck,
    GatewayCheckReply,
    GenerateRequest,
    SamplingSpec,
    TokenChunk,
)
from shared.sampling_params import SamplingParams

GATEWAY = "gw-test"
SECRET = "node-tests-cache-secret"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def node_settings(kind: type[Any], node_id: str, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "node_id": node_id,
        "transfer": "tcp",
        "heartbeat_interval_s": 0.2,
        "lease_ttl_s": 5.0,
        "handoff_timeout_s": 0.5,
        "gateway_check_s": 0.3,
        "drain_timeout_s": 3.0,
        "cache_secret": SECRET,
        "cachemeta_url": "",
    }
    return kind(**(values | overrides))


def request(
    request_id: str, prompt: list[int], params: SamplingParams = GREEDY, **fields: Any
) -> GenerateRequest:
    values: dict[str, Any] = {"gateway_id": GATEWAY} | fields
    return GenerateRequest(
        request_id=request_id,
        tenant="alice",
        prompt_token_ids=prompt,
        sampling=SamplingSpec.from_params(params),
        **values,
    )


@dataclass
class Stream:
    """Every chunk of one request id, in arrival order."""

    chunks: list[TokenChunk] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_chunk(self, chunk: TokenChunk) -> None:
        self.chunks.append(chunk)
        self.changed.set()

    @property
    def tokens(self) -> list[int]:
        """Token ids by completion position (duplicates dropped)."""
        by_position: dict[int, int] = {}
        for chunk in self.chunks:
            for i, token in enumerate(chunk.token_ids):
                by_position.setdefault(chunk.index + i, token)
        return [by_position[i] for i in sorted(by_position)]

    @property
    def ended(self) -> bool:
        return any(c.finish_reason or c.error or c.migrate for c in self.chunks)

    async def wait(self, done: Callable[[Stream], bool], timeout_s: float = 30.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not done(self):
                self.changed.clear()
                await self.changed.wait()


@dataclass
class Cluster:
    """Owns the services, the broker and the test's own bus client. ``wanted`` is what the
    stand-in gateway says it still waits for (None: everything)."""

    make_engine: Callable[..., LLMEngine]
    broker: MemoryBroker = field(default_factory=MemoryBroker)
    prefills: dict[str, PrefillService] = field(default_factory=dict)
    decodes: dict[str, DecodeService] = field(default_factory=dict)
    wanted: set[str] | None = None
    step_delay_s: float = 0.0  # slows every forward pass, so a test can act mid-stream
    bus: MemoryBus = field(init=False)

    def __post_init__(self) -> None:
        self.bus = MemoryBus(self.broker)

    async def start(self, prefills: int = 1, decodes: int = 1, **overrides: Any) -> None:
        await self.bus.serve(subjects.gateway_checks(GATEWAY), GatewayCheck, self._check)
        for i in range(prefills):
            await self.add_prefill(f"p{i}", **overrides)
        for i in range(decodes):
            await self.add_decode(f"d{i}", **overrides)

    async def add_prefill(self, node_id: str, **overrides: Any) -> PrefillService:
        settings = node_settings(PrefillSettings, node_id, **overrides)
        service = PrefillService(settings, self._engine(), self.bus.client())
        await service.start()
        self.prefills[node_id] = service
        return service

    async def add_decode(self, node_id: str, **overrides: Any) -> DecodeService:
        settings = node_settings(DecodeSettings, node_id, **overrides)
        service = DecodeService(settings, self._engine(), self.bus.client())
        await service.start()
        self.decodes[node_id] = service
        return service

    def _engine(self) -> LLMEngine:
        engine: LLMEngine = self.make_engine()
        delay, execute = self.step_delay_s, engine.runner.execute
        if delay:

            def slow(plan: Any) -> Any:
                time.sleep(delay)  # simulated slow work, not synchronisation
                return execute(plan)

            engine.runner.execute = slow  # type: ignore[method-assign]
        return engine

    async def _check(self, check: GatewayCheck) -> GatewayCheckReply:
        wanted = self.wanted
        unknown = [] if wanted is None else [i for i in check.request_ids if i not in wanted]
        return GatewayCheckReply(unknown=unknown)

    async def watch(self, request_id: str) -> Stream:
        stream = Stream()
        await self.bus.subscribe(subjects.tokens(request_id), TokenChunk, stream.on_chunk)
        return stream

    async def submit(
        self,
        req: GenerateRequest,
        prefill: str = "p0",
        decodes: tuple[str, ...] = ("d0",),
        pulls: tuple[PullPlan, ...] = (),
    ) -> tuple[TaskAck, Stream]:
        stream = await self.watch(req.request_id)
        task = PrefillTask(request=req, decode_nodes=list(decodes), pulls=list(pulls))
        ack = await self.bus.request(subjects.prefill_tasks(prefill), task, TaskAck, 5.0)
        return ack, stream

    async def stop(self) -> None:
        for service in [*self.prefills.values(), *self.decodes.values()]:
            await service.stop()
        await self.bus.close()
