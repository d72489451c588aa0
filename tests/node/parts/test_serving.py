"""``NodeServing`` on its own: screening refuses while draining or unhealthy, acknowledges a
repeat and refuses a full queue; failing or aborting a request ends it in the table and ends
its leases exactly once; an abort its stream key did not sign is ignored."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from shared import subjects
from shared.cluster_messages import TaskAck
from shared.memory_bus import MemoryBus
from shared.messages import AbortRequest, SamplingSpec, TokenChunk
from shared.node.leases import Lease, LeaseKind
from shared.node.requests import NodeRequest, Stage
from shared.node.serving import NodeServing
from shared.sampling_params import SamplingParams
from shared.stream_auth import new_stream_key, seal_abort
from tests.engine.conftest import EngineFactory
from tests.node.cluster import request
from tests.node.parts.rig import PLAIN, Outputs, hang_steps, prompt, serving_node
from tests.support.wait import wait_for_condition

Scenario = Callable[[NodeServing, MemoryBus], Awaitable[None]]
ENDLESS = SamplingParams(max_tokens=900, temperature=0.0, ignore_eos=True)


def run(engine: Any, scenario: Scenario, **options: Any) -> None:
    async def main() -> None:
        bus = MemoryBus()
        try:
            async with serving_node(engine, bus.client(), **options) as node:
                await scenario(node, bus)
        finally:
            await bus.close()

    asyncio.run(main())


def count_lease_ends(node: NodeServing) -> list[Lease]:
    """Every lease the block server is asked to end, in order."""
    ended: list[Lease] = []
    end = node.blocks.end

    async def counted(lease: Lease) -> None:
        ended.append(lease)
        await end(lease)

    node.blocks.end = counted  # type: ignore[method-assign]
    return ended


def refused(answer: TaskAck | SamplingParams, reason: str) -> bool:
    return isinstance(answer, TaskAck) and not answer.accepted and answer.reason == reason


def test_screen_takes_fresh_work_acks_a_repeat_and_refuses_a_full_queue(
    make_engine: EngineFactory,
) -> None:
    async def scenario(node: NodeServing, bus: MemoryBus) -> None:
        offered = request("r", prompt(1), PLAIN)
        limit = node.settings.max_waiting
        assert node.screen(offered, limit - 1, "queue") == PLAIN
        assert refused(node.screen(offered, limit, "prefill queue"), "the prefill queue is full")
        node.requests.accept(NodeRequest("r", "gw", 0.0, 0))
        repeat = node.screen(offered, limit, "queue")
        assert isinstance(repeat, TaskAck) and repeat.accepted
        assert repeat.node_id == node.node_id and repeat.epoch == node.epoch
        bad = request("bad", prompt(1), PLAIN)
        bad.sampling = SamplingSpec(max_tokens=4, keep="forever")
        answer = node.screen(bad, 0, "queue")
        assert isinstance(answer, TaskAck) and not answer.accepted and answer.error_code == 400
        node.draining = True
        assert refused(node.screen(request("s", prompt(2), PLAIN), 0, "queue"), "draining")

    run(make_engine(), scenario)


def test_screen_refuses_while_a_step_hangs(make_engine: EngineFactory) -> None:
    engine = make_engine()
    release = hang_steps(engine)

    async def scenario(node: NodeServing, bus: MemoryBus) -> None:
        offered = request("s", prompt(2), PLAIN)
        try:
            assert node.screen(offered, 0, "queue") == PLAIN
            await node.host.add("busy", prompt(3), PLAIN, b"")
            await wait_for_condition(lambda: node.refusal() is not None, "the hung step to show")
            assert refused(node.screen(offered, 0, "queue"), "unhealthy")
        finally:
            release.set()
        await wait_for_condition(lambda: node.refusal() is None, "the step to return")
        assert node.screen(offered, 0, "queue") == PLAIN

    run(engine, scenario, step_timeout_s=0.2)


def test_fail_ends_the_request_and_its_lease_once(make_engine: EngineFactory) -> None:
    outputs = Outputs()

    async def scenario(node: NodeServing, bus: MemoryBus) -> None:
        chunks: list[TokenChunk] = []

        async def on_chunk(chunk: TokenChunk) -> None:
            chunks.append(chunk)

        await bus.subscribe(subjects.tokens("r"), TokenChunk, on_chunk)
        ended = count_lease_ends(node)
        node.requests.accept(NodeRequest("r", "gw", 0.0, 0))
        host = node.host
        await host.add("r", prompt(4), PLAIN, b"", hold_blocks=True)
        await outputs.wait_final("r")
        held = await host.held_block_ids("r")
        assert held
        lease = node.leases.grant(LeaseKind.HANDOFF, 0.0, held, request_id="r")

        await node.fail("r", "the decode node vanished", 503)
        failed = node.requests.get("r")
        assert failed is not None and failed.stage is Stage.DONE
        assert (failed.error, failed.error_code) == ("the decode node vanished", 503)
        assert ended == [lease] and len(node.leases) == 0
        assert await host.held_block_ids("r") is None  # its blocks went back to the pool
        await wait_for_condition(lambda: bool(chunks), "the error chunk")
        assert chunks[-1].error == "the decode node vanished" and chunks[-1].node_id == "n0"

        await node.end_lease(lease)  # a late release of the same lease
        await node.fail("r", "again", 500)
        assert ended == [lease]

    run(make_engine(), scenario, on_outputs=outputs.on_outputs)


def test_abort_stops_the_engine_and_ends_the_lease_once(make_engine: EngineFactory) -> None:
    outputs = Outputs()

    async def scenario(node: NodeServing, bus: MemoryBus) -> None:
        ended = count_lease_ends(node)
        engine = node.host.engine
        node.requests.accept(NodeRequest("r", "gw", 0.0, 0))
        await node.host.add("r", prompt(5), ENDLESS, b"")
        lease = node.leases.grant(LeaseKind.HANDOFF, 0.0, [], request_id="r")
        await node.abort("r")
        aborted = node.requests.get("r")
        assert aborted is not None and aborted.finish_reason == "abort"
        assert engine.num_unfinished_requests == 0
        final = outputs.final("r")
        assert final is None or len(final.output_token_ids) < ENDLESS.max_tokens
        assert ended == [lease]
        await node.abort("r")
        assert ended == [lease]

    run(make_engine(num_kv_blocks=256), scenario, on_outputs=outputs.on_outputs)


def test_an_abort_not_signed_with_the_stream_key_is_ignored(make_engine: EngineFactory) -> None:
    async def scenario(node: NodeServing, bus: MemoryBus) -> None:
        key = new_stream_key()
        node.requests.accept(NodeRequest("r", "gw", 0.0, 0, stream_key=key))
        await node.on_abort(AbortRequest(request_id="r"))
        await node.on_abort(seal_abort(AbortRequest(request_id="r"), new_stream_key()))
        await node.on_abort(seal_abort(AbortRequest(request_id="r", only_node="n9"), key))
        assert node.requests.active_ids() == ["r"]
        await node.on_abort(seal_abort(AbortRequest(request_id="r"), key))
        assert node.requests.active_ids() == []

    run(make_engine(), scenario)
