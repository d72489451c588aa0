"""KV events on a real server with the generated users: each publisher (a prefill or decode
node, a tierd) sends its own events and hears the resend requests addressed to it; kvindex
hears every publisher's events and may ask any of them to resend. Nobody publishes events
under another publisher's id, and nobody but kvindex reads them. Every refusal is checked
twice: the server reports the violation, and nothing arrives. Then the real feed and the real
index meet over that server as their own users."""

from __future__ import annotations

import asyncio

import pytest

from services.kvindex.config import KvIndexSettings
from services.kvindex.main import KvIndexService
from shared import subjects
from shared.bus import NatsBus
from shared.kv_event_feed import ChainBlock, KvEventFeed
from tests.plane.conftest import connect, deliver
from tests.support.nats import NatsServer
from tests.support.wait import wait_for_condition

# (sender, receiver, subject): what must get through
ALLOWED: list[tuple[str, str, str]] = [
    ("prefill-0", "kvindex", subjects.kv_events("prefill-0")),
    ("prefill-1", "kvindex", subjects.kv_events("prefill-1")),
    ("decode-0", "kvindex", subjects.kv_events("decode-0")),
    ("tierd-host", "kvindex", subjects.kv_events("tierd-host")),
    ("kvindex", "prefill-0", subjects.kv_resyncs("prefill-0")),
    ("kvindex", "decode-1", subjects.kv_resyncs("decode-1")),
    ("kvindex", "tierd-host", subjects.kv_resyncs("tierd-host")),
]
# (sender, receiver, subject): events or resend requests in another's name
FORGED: list[tuple[str, str, str]] = [
    ("prefill-0", "kvindex", subjects.kv_events("prefill-1")),
    ("decode-1", "kvindex", subjects.kv_events("decode-0")),
    ("decode-0", "kvindex", subjects.kv_events("prefill-0")),
    ("prefill-1", "kvindex", subjects.kv_events("tierd-host")),
    ("tierd-host", "kvindex", subjects.kv_events("decode-0")),
    ("gateway-0", "kvindex", subjects.kv_events("prefill-0")),
    ("scheduler-0", "kvindex", subjects.kv_events("decode-0")),
    # kvindex reads events; it cannot make them up.
    ("kvindex", "kvindex", subjects.kv_events("prefill-0")),
    ("decode-0", "prefill-0", subjects.kv_resyncs("prefill-0")),
    ("gateway-0", "tierd-host", subjects.kv_resyncs("tierd-host")),
]


@pytest.mark.parametrize(
    ("sender", "receiver", "subject", "allowed"),
    [(*row, True) for row in ALLOWED] + [(*row, False) for row in FORGED],
)
def test_a_publisher_speaks_only_for_itself(
    server: NatsServer, sender: str, receiver: str, subject: str, allowed: bool
) -> None:
    got, refused = asyncio.run(deliver(server, sender, receiver, subject, allowed))
    assert (got, refused) == (allowed, not allowed)


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("prefill-0", subjects.KV_EVENTS_ALL),
        ("decode-0", subjects.kv_events("decode-1")),
        ("gateway-0", subjects.KV_EVENTS_ALL),
        ("tools", subjects.KV_EVENTS_ALL),
        ("decode-1", subjects.kv_resyncs("decode-0")),
        ("kvindex", subjects.kv_resyncs("prefill-0")),
        ("kvindex", f"{subjects.PREFIX}.tokens.>"),
        ("kvindex", "_INBOX.>"),
    ],
)
def test_only_kvindex_reads_the_events_and_only_the_publisher_its_requests(
    server: NatsServer, user: str, subject: str
) -> None:
    async def scenario() -> None:
        async with connect(server, user) as conn:
            await conn.nc.subscribe(subject)
            assert await conn.refused(subject)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "subject",
    [subjects.REQUESTS, subjects.ABORTS, subjects.heartbeats("decode", "decode-0"), "x"],
)
def test_kvindex_publishes_nothing_but_resend_requests(server: NatsServer, subject: str) -> None:
    async def scenario() -> None:
        async with connect(server, "kvindex") as kvindex:
            await kvindex.nc.publish(subject, b"{}")
            assert await kvindex.refused(subject)

    asyncio.run(scenario())


def h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_a_nodes_feed_and_the_index_meet_as_their_own_users(server: NatsServer) -> None:
    """decode-0's feed sends a frame before kvindex listens, then another: kvindex, joining
    late, folds the second and asks decode-0 for a resend, which reaches the feed."""

    async def scenario() -> None:
        node_bus = await NatsBus.connect(
            server.url, "crescent-decode-0", **server.connect_options("decode-0")
        )
        feed = KvEventFeed(node_bus, "decode-0")
        await feed.stored("dram", [ChainBlock(h(1), h(0), 16)])
        await node_bus.flush()  # its resend subscription is on the server
        index_bus = await NatsBus.connect(
            server.url, "crescent-kvindex", **server.connect_options("kvindex")
        )
        service = KvIndexService(KvIndexSettings(kvindex_port=0, dev_mode=True), index_bus)
        await service.start()
        try:
            await index_bus.flush()
            await feed.stored("dram", [ChainBlock(h(2), h(1), 16)])
            views = service.index.publishers
            await wait_for_condition(lambda: "decode-0" in views, "kvindex to fold decode-0")
            assert views["decode-0"].last_seq == 1
            await wait_for_condition(feed.take_resend, "kvindex's resend request at the feed")
            assert service.handlers.resyncs_asked == 1
            assert service.handlers.frames["folded"] == 1
        finally:
            await service.stop()
            await node_bus.close()

    asyncio.run(scenario())
