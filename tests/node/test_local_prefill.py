"""A decode node prefills a task of its own (conditional disaggregation): no hand-off, the same
tokens as the disaggregated path, the phases of both roles on its chunks."""

from __future__ import annotations

import asyncio

import pytest

from shared import phases, subjects
from shared.bus import NoResponders
from shared.cluster_messages import NodeStatus, PrefillTask, TaskAck
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.node.cluster import Cluster, Stream, request
from tests.support.wait import wait_for_condition


async def submit_local(cluster: Cluster, rid: str, prompt: list[int]) -> tuple[TaskAck, Stream]:
    stream = await cluster.watch(rid)
    task = PrefillTask(request=request(rid, prompt), decode_nodes=["d0"])
    ack = await cluster.bus.request(subjects.local_tasks("d0"), task, TaskAck, 5.0)
    return ack, stream


def test_a_local_task_is_served_by_the_decode_node_alone_with_the_same_tokens(
    make_engine: EngineFactory,
) -> None:
    first_prompt, second_prompt = prompts(2, 40, 40, seed=61)

    async def scenario() -> None:
        cluster = Cluster(make_engine, step_delay_s=0.01)
        beats: list[NodeStatus] = []

        async def on_beat(status: NodeStatus) -> None:
            beats.append(status)

        await cluster.bus.subscribe(subjects.heartbeats("decode", "d0"), NodeStatus, on_beat)
        await cluster.start()
        try:
            ack, handed = await cluster.submit(request("r-remote", first_prompt))
            assert ack.accepted
            await handed.wait(lambda s: s.ended)
            ack, local = await submit_local(cluster, "r-local", second_prompt)
            assert ack.accepted and ack.node_id == "d0"
            await local.wait(lambda s: s.ended)
            ack, again = await submit_local(cluster, "r-local-again", first_prompt)
            assert ack.accepted
            await again.wait(lambda s: s.ended)
            decode = cluster.decodes["d0"].node
            await wait_for_condition(
                lambda: any(b.handoff_samples for b in beats), "a beat with the hand-off timing"
            )
            await wait_for_condition(
                lambda: any("r-local-again" in b.arrived for b in beats), "the repeat named"
            )
            block_size = decode.engine.config.block_size
            received = decode.puller.bytes_received
            sent = cluster.prefills["p0"].node.server.bytes_sent
        finally:
            await cluster.stop()
        assert again.tokens == handed.tokens  # the same prompt, prefilled here or there
        assert len(local.tokens) == 12
        assert {c.node_id for c in local.chunks} == {"d0"}
        assert not any(c.owner for c in local.chunks)  # no owner change: no hand-off
        with_tokens = [c for c in local.chunks if c.token_ids]
        assert set(with_tokens[0].phases) == {
            phases.PREFILL_QUEUE,
            phases.PREFIX_FETCH,
            phases.PREFILL_COMPUTE,
        }
        assert with_tokens[0].phases[phases.PREFILL_COMPUTE] >= 0.01
        assert phases.KV_HANDOFF not in with_tokens[1].phases
        last = with_tokens[-1]
        assert last.finish_reason == "length" and last.phases[phases.DECODE_STEP] >= 0.01
        # Only the disaggregated request's KV crossed; the decode node reports its timing.
        assert received == sent > 0
        assert beats and all(b.local_prefill for b in beats)
        samples = [s for b in beats for s in b.handoff_samples]
        assert [blocks for blocks, _ in samples] == [-(-40 // block_size)]
        # Each request is named once, in the beat after it reached the node, ended or not.
        named = [rid for b in beats for rid in b.arrived]
        assert named == ["r-remote", "r-local", "r-local-again"]
        assert all(seconds > 0 for _, seconds in samples)
        # The repeat found the prompt in the decode node's own pool (it decoded it before), all
        # but its last token, which is always computed.
        assert block_size < 40 and again.chunks[0].num_cached_tokens == 40 - 1

    asyncio.run(scenario())


def test_a_decode_node_without_local_prefill_takes_no_prefill_tasks(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 20, 20, seed=62)[0]

    async def scenario() -> None:
        cluster = Cluster(make_engine)
        await cluster.start(local_prefill=False)
        try:
            with pytest.raises(NoResponders):
                await submit_local(cluster, "r1", prompt)
            status = await cluster.decodes["d0"].node.beats.status()
        finally:
            await cluster.stop()
        assert not status.local_prefill

    asyncio.run(scenario())
