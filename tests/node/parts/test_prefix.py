"""``PrefixFetcher`` on its own: a source node's block server answers pins on the in-memory
bus and serves pulls over TCP. A planned pull replaces computing (the tokens are a cold
run's), a plan that fails falls back to computing, and a request no longer wanted leaves the
pulled blocks cached without being admitted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from shared import subjects
from shared.cluster_messages import LeaseRelease, PinRequest, PullPlan
from shared.kv.checksum import BlockChecksum
from shared.memory_bus import MemoryBus
from shared.node.engine_host import EngineHost
from shared.node.leases import LeaseTable
from shared.node.pins import BlockServer
from shared.node.prefix import FetchedPrefix, PrefixFetcher
from shared.node.puller import BlockPuller
from shared.sampling_params import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.node.parts.rig import Outputs, prompt, running_host, tcp_server
from tests.support.wait import wait_for_condition

TOKENS = prompt(7, 26)  # six full blocks and two tokens
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PLAN = PullPlan(node_id="src", first_block=0, num_blocks=6)


@dataclass
class Pair:
    """A source node's block server and a fetching node's parts, on one bus."""

    source: BlockServer
    host: EngineHost
    outputs: Outputs
    fetcher: PrefixFetcher
    cold: list[int]  # the tokens a cold run of ``TOKENS`` produces


@asynccontextmanager
async def pair(make_engine: EngineFactory) -> AsyncIterator[Pair]:
    source_engine = make_engine()
    cold = source_engine.generate([TOKENS], GREEDY)[0].output_token_ids
    bus = MemoryBus()
    servers: list[BlockServer] = []
    async with (
        running_host(source_engine) as (source_host, _),
        tcp_server(lambda lease, ids: servers[0].provide(lease, ids)) as transfer,
        running_host(make_engine()) as (host, outputs),
    ):
        blocks = BlockServer(
            source_host, source_host.cache, LeaseTable(60.0), "tcp", transfer.address
        )
        servers.append(blocks)

        async def on_release(release: LeaseRelease) -> None:
            await blocks.release(release.lease_id)

        await bus.serve(subjects.peer_pins("src"), PinRequest, blocks.on_pin)
        await bus.subscribe(subjects.lease_releases("src"), LeaseRelease, on_release)
        puller = BlockPuller(host.cache, BlockChecksum(b""))
        fetcher = PrefixFetcher(bus.client(), host, puller, pin_timeout_s=5.0)
        try:
            yield Pair(blocks, host, outputs, fetcher, cold)
        finally:
            await puller.close()
            await bus.close()


def keep_all(fetched: FetchedPrefix) -> bool:
    return True


def test_a_planned_pull_replaces_computing(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with pair(make_engine) as p:
            assert await p.fetcher.admit("r", TOKENS, GREEDY, b"", [PLAN], keep_all)
            final = await p.outputs.wait_final("r")
            assert final.num_cached_tokens == 24
            assert final.output_token_ids == p.cold
            assert p.fetcher.puller.blocks_pulled == 6 and p.fetcher.pulls_failed == 0
            # The source's pin ends once the pull is over.
            await wait_for_condition(lambda: len(p.source.leases) == 0, "the pin to end")

    asyncio.run(scenario())


def test_a_failing_plan_falls_back_to_computing(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        async with pair(make_engine) as p:
            gone = PullPlan(node_id="nobody", first_block=0, num_blocks=6)
            assert await p.fetcher.admit("r", TOKENS, GREEDY, b"", [gone], keep_all)
            final = await p.outputs.wait_final("r")
            assert final.num_cached_tokens == 0
            assert final.output_token_ids == p.cold
            assert p.fetcher.pulls_failed == 1 and p.fetcher.puller.blocks_pulled == 0

    asyncio.run(scenario())


def test_a_request_no_longer_wanted_leaves_its_pulled_blocks_cached(
    make_engine: EngineFactory,
) -> None:
    async def scenario() -> None:
        async with pair(make_engine) as p:
            seen: list[FetchedPrefix] = []

            def aborted(fetched: FetchedPrefix) -> bool:
                seen.append(fetched)
                return False

            assert not await p.fetcher.admit("r", TOKENS, GREEDY, b"", [PLAN], aborted)
            assert len(seen) == 1 and seen[0].blocks_by_tier == {"dram": 6}
            hashes = p.host.prompt_hashes(TOKENS, b"")
            assert await p.host.num_leading_cached(hashes) == 6
            assert p.host.engine.num_unfinished_requests == 0
            assert p.outputs.seen == []

    asyncio.run(scenario())
