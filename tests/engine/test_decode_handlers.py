"""The decode node's handoff handling, with real engines, a real TCP block server, and a bus
that records what would be published."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from services.decode.handlers import DecodeHandlers
from shared import subjects
from shared.cluster_messages import KVHandoff, LeaseRelease
from shared.engine.async_engine import AsyncEngine
from shared.engine.engine import LLMEngine
from shared.kv.hashing import block_checksum
from shared.messages import GenerateRequest, SamplingSpec, TokenChunk
from shared.transfer.base import create_server
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.engine.test_handoff import FULL, prefill


class RecordingBus:
    def __init__(self) -> None:
        self.published: list[tuple[str, Any]] = []

    async def publish(self, subject: str, message: Any) -> None:
        self.published.append((subject, message))

    def on(self, subject: str) -> list[Any]:
        return [m for s, m in self.published if s == subject]


async def run_handoff(
    prefill_node: LLMEngine, decode_node: LLMEngine, prompt: list[int], corrupt: bool
) -> tuple[RecordingBus, int]:
    first = prefill(prefill_node, "r", prompt)
    held = prefill_node.held_block_ids("r")
    assert held is not None
    cache = prefill_node.runner.cache
    checksums = [block_checksum(cache.block_buffer(b).data) for b in held]

    def provide(lease_id: str, block_ids: Sequence[int]) -> list[np.ndarray]:
        buffers = [cache.block_buffer(b).copy() for b in block_ids]
        if corrupt:
            buffers[-1][100] ^= 0xFF  # one bit flipped on the way
        return buffers

    server = create_server("tcp", provide)
    await server.start()
    bus = RecordingBus()
    handlers: DecodeHandlers
    engine = AsyncEngine(decode_node, lambda outs: handlers.on_outputs(outs))
    handlers = DecodeHandlers(bus, engine, decode_node.runner.cache, "secret")  # type: ignore[arg-type]
    engine.start()
    request = GenerateRequest(
        request_id="r",
        tenant="t",
        prompt_token_ids=prompt,
        sampling=SamplingSpec.from_params(FULL),
    )
    await handlers.on_handoff(
        KVHandoff(
            request=request,
            first_token=first,
            prefill_node="p0",
            transfer_kind="tcp",
            transfer_address=server.address,
            lease_id="r",
            block_ids=held,
            block_checksums=checksums,
        )
    )
    for _ in range(200):
        if any(c.finish_reason for c in bus.on(subjects.tokens("r"))):
            break
        await asyncio.sleep(0.02)
    await engine.stop()
    await handlers.close()
    await server.close()
    return bus, first


@pytest.mark.parametrize("corrupt", [False, True])
def test_pulled_or_recomputed_the_tokens_are_the_same(
    make_engine: EngineFactory, corrupt: bool
) -> None:
    prompt = prompts(1, 21, 21, seed=30)[0]
    expected = make_engine().generate([prompt], FULL)[0].output_token_ids
    prefill_node, decode_node = make_engine(), make_engine()
    bus, first = asyncio.run(run_handoff(prefill_node, decode_node, prompt, corrupt))
    chunks: list[TokenChunk] = sorted(bus.on(subjects.tokens("r")), key=lambda c: c.index)
    # The prefill node produced the first token; the decode node streams from index 1 on.
    assert first == expected[0] and chunks[0].index == 1
    assert [t for c in chunks for t in c.token_ids] == expected[1:]
    assert chunks[-1].finish_reason == "length"
    assert bus.on(subjects.lease_releases("p0")) == [LeaseRelease(lease_id="r")]
    computed = decode_node.stats.prompt_tokens_computed
    assert computed == (len(prompt) if corrupt else 0)
    assert decode_node.stats.prompt_tokens_imported == (0 if corrupt else len(prompt))
