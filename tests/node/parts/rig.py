"""What the node part tests share: a started engine host that records what it delivers,
seeded prompts, a TCP block server over a provider, and one node's serving parts wired as
the runtime wires them, on an in-memory bus."""

from __future__ import annotations

import random
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from services.prefill.config import PrefillSettings
from shared.engine.engine import LLMEngine
from shared.engine.types import RequestOutput
from shared.kv.checksum import BlockChecksum
from shared.memory_bus import MemoryBus
from shared.node.engine_host import EngineHost, OnOutputs
from shared.node.leases import LeaseTable
from shared.node.metrics import NodeMetrics
from shared.node.pins import BlockServer
from shared.node.puller import BlockPuller
from shared.node.requests import RequestTable
from shared.node.serving import NodeServing
from shared.node.sink import SinkServer
from shared.sampling_params import SamplingParams
from shared.transfer.base import BlockProvider, TransferServer, create_server
from tests.node.cluster import node_settings
from tests.support.wait import wait_for_condition

PLAIN = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
NODE = "n0"


def hang_steps(engine: LLMEngine) -> threading.Event:
    """Makes every forward pass of ``engine`` wait until the returned event is set."""
    release, execute = threading.Event(), engine.runner.execute

    def hangs(plan: Any) -> Any:
        release.wait(30)
        return execute(plan)

    engine.runner.execute = hangs  # type: ignore[method-assign,assignment]
    return release


def prompt(seed: int, length: int = 24) -> list[int]:
    """A random prompt of tokens above the special ones (``length // 4`` full blocks)."""
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(length)]


@dataclass
class Outputs:
    """Owns every output a host delivered, in delivery order."""

    seen: list[RequestOutput] = field(default_factory=list)

    async def on_outputs(self, outputs: list[RequestOutput]) -> None:
        self.seen.extend(outputs)

    def of(self, request_id: str) -> list[RequestOutput]:
        return [o for o in self.seen if o.request_id == request_id]

    def final(self, request_id: str) -> RequestOutput | None:
        return next((o for o in self.of(request_id) if o.finished), None)

    async def wait_final(self, request_id: str) -> RequestOutput:
        await wait_for_condition(lambda: self.final(request_id) is not None, f"{request_id} to end")
        final = self.final(request_id)
        assert final is not None
        return final


@asynccontextmanager
async def running_host(
    engine: LLMEngine, step_timeout_s: float = 30.0, on_outputs: OnOutputs | None = None
) -> AsyncIterator[tuple[EngineHost, Outputs]]:
    """A started host around ``engine``, stopped on the way out."""
    outputs = Outputs()
    host = EngineHost(engine, on_outputs or outputs.on_outputs, step_timeout_s)
    host.start()
    try:
        yield host, outputs
    finally:
        await host.stop()


async def run_to_end(
    host: EngineHost,
    outputs: Outputs,
    request_id: str,
    tokens: list[int],
    params: SamplingParams = PLAIN,
    **options: Any,
) -> RequestOutput:
    """Adds a request through the host and waits for its last output."""
    await host.add(request_id, tokens, params, b"", **options)
    return await outputs.wait_final(request_id)


@asynccontextmanager
async def tcp_server(provider: BlockProvider) -> AsyncIterator[TransferServer]:
    """A started TCP transfer server on loopback, closed on the way out."""
    server = create_server("tcp", provider)
    await server.start()
    try:
        yield server
    finally:
        await server.close()


@asynccontextmanager
async def serving_node(
    engine: LLMEngine,
    bus: MemoryBus,
    step_timeout_s: float = 30.0,
    on_outputs: OnOutputs | None = None,
    **overrides: Any,
) -> AsyncIterator[NodeServing]:
    """One node's serving parts around a started host, wired as ``NodeRuntime`` wires them
    (no role, no subscriptions: a test calls the parts itself); the host's outputs go to
    ``on_outputs``, else to a record nobody reads."""
    settings = node_settings(PrefillSettings, NODE, **overrides)
    leases = LeaseTable(settings.lease_ttl_s)
    blocks: list[BlockServer] = []
    async with (
        running_host(engine, step_timeout_s, on_outputs) as (host, _),
        tcp_server(lambda lease, ids: blocks[0].provide(lease, ids)) as server,
    ):
        address = server.address
        blocks.append(BlockServer(host, host.cache, leases, "tcp", address))
        sinks = SinkServer(host, leases, "tcp", address, host.block_bytes)
        puller = BlockPuller(host.cache, BlockChecksum(b""))

        async def beat() -> None:
            return None

        try:
            yield NodeServing(
                settings, NODE, "epoch-1", RequestTable(), leases, host, bus,
                NodeMetrics(NODE, "prefill"), puller, blocks[0], sinks, address, beat,
            )  # fmt: skip
        finally:
            await puller.close()
