"""The phases a prefill and a decode node time of a request ride on its chunks."""

from __future__ import annotations

import asyncio

from shared import phases
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.node.cluster import Cluster, request


def test_the_nodes_send_what_they_timed_with_the_first_and_last_tokens(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 22, 22, seed=51)[0]

    async def scenario() -> None:
        cluster = Cluster(make_engine, step_delay_s=0.01)
        await cluster.start()
        try:
            ack, stream = await cluster.submit(request("r1", prompt))
            assert ack.accepted
            await stream.wait(lambda s: s.ended)
        finally:
            await cluster.stop()
        with_tokens = [c for c in stream.chunks if c.token_ids]
        first, second, last = with_tokens[0], with_tokens[1], with_tokens[-1]
        assert first.node_id == "p0" and set(first.phases) == {
            phases.PREFILL_QUEUE,
            phases.PREFIX_FETCH,
            phases.PREFILL_COMPUTE,
        }
        # Every forward pass sleeps 10 ms: the prefill's compute holds at least one.
        assert first.phases[phases.PREFILL_COMPUTE] >= 0.01
        assert first.phases[phases.PREFIX_FETCH] == 0.0  # nothing was planned to pull
        assert second.node_id == "d0"
        assert set(second.phases) == {phases.KV_HANDOFF, phases.FIRST_DECODE_STEP}
        assert second.phases[phases.FIRST_DECODE_STEP] >= 0.01
        middle = with_tokens[2:-1]
        assert middle and not any(c.phases for c in middle)
        assert last.finish_reason == "length"
        assert last.phases[phases.DECODE_STEP] >= last.phases[phases.ENGINE_STEP] >= 0.01
        assert 0 < last.phases[phases.TOKEN_PUBLISH] < last.phases[phases.DECODE_STEP]

    asyncio.run(scenario())
