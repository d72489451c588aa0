"""What a node ends on its own (requests whose gateway is gone, forgot them, or whose deadline
passed) and how a draining decode node hands its requests back with their KV kept."""

from __future__ import annotations

import asyncio
import time

from shared import subjects
from shared.cluster_messages import PullPlan
from shared.messages import AbortRequest
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine_scheduling import prompts
from tests.node.cluster import Cluster, request
from tests.support.wait import wait_for_condition

LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
GREEDY_40 = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


async def stops_within(cluster: Cluster, request_id: str, seconds: float) -> None:
    """Waits until no node holds ``request_id``; ``seconds`` is a bound on handling the fault
    in time (several times the node's check period), not a synchronisation delay."""
    nodes = [p.node for p in cluster.prefills.values()]
    nodes += [d.node for d in cluster.decodes.values()]

    def stopped() -> bool:
        return all(n.requests.active(request_id) is None for n in nodes)

    await wait_for_condition(stopped, f"every node to stop {request_id}", seconds)


def run(make_engine: EngineFactory, scenario) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        cluster = Cluster(make_engine, step_delay_s=0.01)
        await cluster.start()
        try:
            await scenario(cluster)
        finally:
            await cluster.stop()

    asyncio.run(main())


def test_a_request_whose_gateway_is_gone_stops(make_engine: EngineFactory) -> None:
    async def scenario(cluster: Cluster) -> None:
        ack, stream = await cluster.submit(request("g1", [3, 4, 5, 6, 7], LONG, gateway_id="gw-x"))
        assert ack.accepted
        await stops_within(cluster, "g1", 3.0)
        assert len(stream.tokens) < 200 and not stream.ended, [c.error for c in stream.chunks]

    run(make_engine, scenario)


def test_a_request_its_gateway_forgot_stops(make_engine: EngineFactory) -> None:
    async def scenario(cluster: Cluster) -> None:
        cluster.wanted = {"other"}
        ack, _ = await cluster.submit(request("g2", [3, 4, 5, 6, 7], LONG))
        assert ack.accepted
        await stops_within(cluster, "g2", 3.0)

    run(make_engine, scenario)


def test_a_request_past_its_deadline_stops(make_engine: EngineFactory) -> None:
    async def scenario(cluster: Cluster) -> None:
        deadline = time.time() + 0.5
        ack, _ = await cluster.submit(request("g3", [3, 4, 5], LONG, deadline_ts=deadline))
        assert ack.accepted
        await stops_within(cluster, "g3", 3.0)

    run(make_engine, scenario)


def test_a_targeted_abort_stops_only_that_node(make_engine: EngineFactory) -> None:
    async def scenario(cluster: Cluster) -> None:
        ack, stream = await cluster.submit(request("g4", [3, 4, 5, 6], LONG))
        assert ack.accepted
        await stream.wait(lambda s: len(s.tokens) >= 3)
        await cluster.bus.publish(subjects.ABORTS, AbortRequest(request_id="g4", only_node="p0"))
        p0, d0 = cluster.prefills["p0"].node, cluster.decodes["d0"].node
        await wait_for_condition(lambda: p0.requests.active("g4") is None, "p0 to end g4")
        await cluster.bus.settle()  # d0's subscription delivers the abort it must ignore
        assert d0.requests.active("g4") is not None
        await cluster.bus.publish(subjects.ABORTS, AbortRequest(request_id="g4", only_node="d0"))
        await stops_within(cluster, "g4", 2.0)

    run(make_engine, scenario)


def test_a_draining_decode_node_hands_back_and_its_kv_is_pulled(
    make_engine: EngineFactory,
) -> None:
    prompt = prompts(1, 21, 21, seed=60)[0]
    expected = make_engine().generate([prompt], GREEDY_40)[0].output_token_ids

    async def scenario(cluster: Cluster) -> None:
        await cluster.add_decode("d1")
        ack, stream = await cluster.submit(request("m1", prompt, GREEDY_40))
        assert ack.accepted
        await stream.wait(lambda s: len(s.tokens) >= 12)
        d0 = cluster.decodes["d0"]
        drain = asyncio.create_task(d0.node.drain())
        await stream.wait(lambda s: s.ended)
        migrate = stream.chunks[-1]
        assert migrate.migrate and migrate.node_id == "d0"
        have = stream.tokens[: migrate.index]
        assert len(have) == migrate.index and have == expected[: migrate.index]
        # The gateway's resume: the prompt plus what the client has, from that position on.
        rest = SamplingParams(
            max_tokens=40 - len(have), temperature=0.0, ignore_eos=True,
            output_offset=len(have),
        )  # fmt: skip
        blocks = (len(prompt) + len(have) - 1) // 4
        plan = PullPlan(node_id="d0", first_block=0, num_blocks=blocks)
        resumed = request("m1-r1", prompt + have, rest, resume=True)
        p0 = cluster.prefills["p0"].node
        computed = p0.host.engine.stats.prompt_tokens_computed
        ack, again = await cluster.submit(resumed, decodes=("d1",), pulls=(plan,))
        assert ack.accepted
        await again.wait(lambda s: s.ended)
        assert again.chunks[0].index == len(have)
        assert have + again.tokens == expected
        # p0 still caches the prompt's 5 full blocks; the reply's came from the draining
        # node, so only the tail after the last full block was computed again.
        assert p0.puller.blocks_pulled == blocks - len(prompt) // 4
        tail = len(prompt) + len(have) - blocks * 4
        assert p0.host.engine.stats.prompt_tokens_computed - computed == tail
        assert d0.node.blocks.pins_served == 1
        await drain

    run(make_engine, scenario)
