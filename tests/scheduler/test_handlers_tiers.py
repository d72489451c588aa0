"""The scheduler with tierds in the cluster: their heartbeats make them sources of pulls from
NVMe and S3 (never places to run a request), and an S3 pull behind a long queue has its blocks
moved up to NVMe first."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from services.scheduler.lookup import prompt_block_hashes
from shared import subjects
from shared.cluster_messages import NodeStatus, PrefetchRequest, PullPlan
from shared.memory_bus import MemoryBus
from shared.messages import WireMessage
from shared.nats_events import DISCONNECT_TYPE
from shared.rpc.types import PrefixHolder
from tests.scheduler.fake_cachemeta import FakeCacheMeta
from tests.scheduler.harness import (
    PROMPT,
    SCOPE,
    SECRET,
    Harness,
    beat,
    generate,
    other_prompt,
    scheduler,
)

BLOCKS = 62  # the prompt's cacheable blocks
HASHES = prompt_block_hashes(PROMPT, SCOPE, SECRET, "tenant-a")
# A tierd on another host than the nodes, with room on NVMe; it reports the node-like load
# fields as idle as can be, so only its role keeps work off it.
TIERD = beat(
    "T",
    "tierd",
    host_id="h2",
    tiers={"nvme": (1 << 40, 0), "s3": (1 << 42, 0)},
    read_bandwidth={"nvme": 2e9, "s3": 3e8},
)
# 20,000 queued tokens wait seconds: far longer than reading 62 blocks from S3.
BUSY = 20_000


def prefill(node_id: str = "A", **load: Any) -> NodeStatus:
    return beat(node_id, "prefill", host_id="h1", **load)


def held(tier: str) -> FakeCacheMeta:
    return FakeCacheMeta([PrefixHolder("T", tier, BLOCKS)])


def nvme_pull() -> list[PullPlan]:
    return [PullPlan(node_id="T", first_block=0, num_blocks=BLOCKS, tier="nvme")]


async def drained(h: Harness) -> list[tuple[str, PrefetchRequest]]:
    await h.bus.settle()
    out = []
    while not h.prefetches.empty():
        out.append(h.prefetches.get_nowait())
    return out


def test_a_tierds_nvme_copy_is_planned_as_a_pull_from_its_nvme() -> None:
    async def scenario() -> None:
        index = held("nvme")
        async with scheduler(index) as h:
            await h.nodes(prefill(), beat("D", "decode"), TIERD)
            assert h.sample("crescent_live_nodes", {"role": "tierd"}) == 1
            reply = await h.send(generate("r-nvme"))
            assert reply.accepted and (reply.prefill_node, reply.decode_node) == ("A", "D")
            node, task = await h.next_task()
            assert (node, task.pulls) == ("A", nvme_pull())
            assert index.tiers == [("dram", "nvme", "s3")]  # every tier is asked about
            assert await drained(h) == []  # NVMe is where a prefetch would bring them
            assert h.sample("crescent_planned_pull_blocks_total") == BLOCKS

    asyncio.run(scenario())


def test_an_s3_pull_behind_a_long_queue_has_its_blocks_moved_to_nvme_first() -> None:
    async def scenario() -> None:
        async with scheduler(held("s3")) as h:
            await h.nodes(prefill(queued_tokens=BUSY), beat("D", "decode"), TIERD)
            reply = await h.send(generate("r-s3"))
            assert reply.accepted and reply.prefill_node == "A"
            _, task = await h.next_task()
            assert task.pulls == [
                PullPlan(node_id="T", first_block=0, num_blocks=BLOCKS, tier="s3")
            ]
            assert await drained(h) == [("T", PrefetchRequest(block_hashes=HASHES, to_tier="nvme"))]
            sent = h.sent()
            # Published before the task was handed over, so the move overlaps the queue wait.
            assert sent.index(subjects.prefetches("T")) < sent.index(subjects.prefill_tasks("A"))
            assert sent.count(subjects.prefetches("T")) == 1
            assert h.sample("crescent_prefetch_blocks_total") == BLOCKS

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("queued", "settings"),
    [(0, {}), (BUSY, {"prefetch": False})],
    ids=["no-queue-to-hide-it", "prefetch-off"],
)
def test_no_prefetch_without_a_wait_to_hide_it_or_when_turned_off(
    queued: int, settings: dict[str, Any]
) -> None:
    async def scenario() -> None:
        async with scheduler(held("s3"), **settings) as h:
            await h.nodes(prefill(queued_tokens=queued), beat("D", "decode"), TIERD)
            assert (await h.send(generate("r-no-prefetch"))).accepted
            _, task = await h.next_task()
            assert [p.tier for p in task.pulls] == ["s3"]
            assert await drained(h) == [] and subjects.prefetches("T") not in h.sent()

    asyncio.run(scenario())


def test_a_failed_prefetch_never_fails_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with scheduler(held("s3")) as h:
            await h.nodes(prefill(queued_tokens=BUSY), beat("D", "decode"), TIERD)
            bus = h.service.bus
            assert isinstance(bus, MemoryBus)
            publish = bus.publish

            async def failing(subject: str, message: WireMessage) -> None:
                if subject == subjects.prefetches("T"):
                    raise ConnectionError("the connection is gone")
                await publish(subject, message)

            monkeypatch.setattr(bus, "publish", failing)
            reply = await h.send(generate("r-failed-prefetch"))
            assert reply.accepted and reply.prefill_node == "A"
            _, task = await h.next_task()
            assert [p.tier for p in task.pulls] == ["s3"]
            assert h.sample("crescent_prefetch_blocks_total") == 0

    asyncio.run(scenario())


def test_a_tierd_is_never_a_prefill_or_decode_node() -> None:
    async def scenario() -> None:
        async with scheduler(held("dram")) as h:  # a tierd's DRAM is not pullable either
            await h.nodes(beat("D", "decode"), TIERD)
            reply = await h.send(generate("r-no-prefill"))
            assert (reply.accepted, reply.error_code) == (False, 503)
            await h.nodes(prefill(queued_tokens=50_000), beat("D", "decode"), TIERD)
            for i in range(3):
                reply = await h.send(generate(f"r-busy-{i}"))
                assert (reply.prefill_node, reply.decode_node) == ("A", "D")
                node, task = await h.next_task()
                assert (node, task.decode_nodes, task.pulls) == ("A", ["D"], [])
        async with scheduler(held("nvme")) as h:
            await h.nodes(prefill(), TIERD)
            reply = await h.send(generate("r-no-decode"))
            assert not reply.accepted and "decode" in reply.error and h.tasks.empty()

    asyncio.run(scenario())


def test_a_tierd_stops_being_a_source_on_a_disconnect_or_silence() -> None:
    async def scenario() -> None:
        async with scheduler(held("nvme"), heartbeat_timeout_s=0.3) as h:
            await h.nodes(prefill(), beat("D", "decode"), TIERD)
            await h.send(generate("r-before"))
            assert (await h.next_task())[1].pulls == nvme_pull()
            event = {"type": DISCONNECT_TYPE, "client": {"name": "crescent-T", "user": "T"}}
            await h.bus.publish_raw(subjects.DISCONNECTS, json.dumps(event).encode())
            await h.bus.settle()
            await h.send(generate("r-disconnected", other_prompt(1)))
            assert (await h.next_task())[1].pulls == []
            await h.beat(TIERD)
            await h.send(generate("r-back", other_prompt(2)))
            assert (await h.next_task())[1].pulls == nvme_pull()
            await asyncio.sleep(0.35)  # past the timeout: only the nodes beat again
            await h.beat(prefill())
            await h.beat(beat("D", "decode"))
            await h.send(
                generate("r-late", other_prompt(3))
            )  # a late tierd's files are still there
            assert (await h.next_task())[1].pulls == nvme_pull()
            await asyncio.sleep(0.6)  # past its grace of three timeouts
            await h.beat(prefill())
            await h.beat(beat("D", "decode"))
            await h.send(generate("r-silent", other_prompt(4)))
            assert (await h.next_task())[1].pulls == []

    asyncio.run(scenario())
