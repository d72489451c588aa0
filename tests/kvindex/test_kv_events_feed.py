"""A publisher's feed on a real NATS server: frames numbered from 0 in vLLM's layout on its
role's and id's subject, a frame lost to a closed connection leaves a hole in the numbers and
a resend owed, and a listener's resend request reaches the feed it names (role and id)."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid

import nats
from nats.aio.msg import Msg

from shared import subjects
from shared.bus import NatsBus
from shared.kv_event_feed import ChainBlock, KvEventFeed
from shared.kv_events import KvResyncRequest
from tests.kvindex.vllm_format import Rebuilt
from tests.support.wait import wait_for_condition


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_frames_are_numbered_and_a_lost_one_leaves_a_hole_and_a_resend_owed(
    nats_url: str,
) -> None:
    publisher = f"n-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        listener = await nats.connect(nats_url)
        got: list[dict[str, object]] = []
        rebuilt = Rebuilt()

        async def on_frame(msg: Msg) -> None:
            got.append(json.loads(msg.data))
            rebuilt.take(msg.data)

        await listener.subscribe(subjects.kv_events("decode", publisher), cb=on_frame)
        await listener.flush()
        bus = await NatsBus.connect(nats_url, f"crescent-{publisher}")
        feed = KvEventFeed(bus, "decode", publisher)
        chain = [ChainBlock(h(1), h(0), 16), ChainBlock(h(2), h(1), 16)]
        await feed.replaced("dram", chain)
        await feed.removed("dram", [h(2)])
        await wait_for_condition(lambda: len(got) == 2, "two frames")
        assert [f["seq"] for f in got] == [0, 1] and {f["epoch"] for f in got} == {feed.epoch}
        assert {(f["role"], f["publisher"]) for f in got} == {("decode", publisher)}
        assert rebuilt.views == {(publisher, "DRAM"): {h(1): h(0)}}
        assert base64.b64decode(str(got[0]["batch"]))[:1] == b"\x93"  # a 3-item msgpack array
        assert feed.take_resend() is False

        await bus.close()
        await feed.stored("dram", [ChainBlock(h(3), h(1), 16)])  # lost: the bus is closed
        assert feed.take_resend() is True and feed.next_seq == 3
        bus = feed.bus = await NatsBus.connect(nats_url, f"crescent-{publisher}")
        await feed.replaced("dram", chain[:1])
        await wait_for_condition(lambda: len(got) == 3, "the resend")
        assert got[-1]["seq"] == 3 and rebuilt.gaps == 1
        assert rebuilt.views == {(publisher, "DRAM"): {h(1): h(0)}}
        await bus.close()
        await listener.close()

    asyncio.run(scenario())


def test_a_listeners_resend_request_reaches_the_feed(nats_url: str) -> None:
    publisher = f"n-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        bus = await NatsBus.connect(nats_url, f"crescent-{publisher}")
        feed = KvEventFeed(bus, "tierd", publisher)
        await feed.stored("nvme", [ChainBlock(h(1), h(0), 16)])  # starts listening
        await bus.flush()
        other = await NatsBus.connect(nats_url, "crescent-kvindex")
        subject = subjects.kv_resyncs("tierd", publisher)
        await other.publish(subject, KvResyncRequest(role="tierd", publisher="someone-else"))
        await other.publish(subject, KvResyncRequest(role="prefill", publisher=publisher))
        await other.publish(subject, KvResyncRequest(role="tierd", publisher=publisher))
        owed: list[bool] = []
        await wait_for_condition(lambda: owed.append(feed.take_resend()) or any(owed), "a resend")
        assert owed.count(True) == 1
        await other.close()
        await bus.close()

    asyncio.run(scenario())
