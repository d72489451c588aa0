"""KV events on a real server with the generated users: each publisher (a prefill or decode
node, a tierd) sends its own events under its role and hears the resend requests addressed to
it; kvindex hears every publisher's events and may ask any of them to resend. Nobody publishes
events under another publisher's id or role, and nobody but kvindex reads them. A user shared
by a role's replicas (Kubernetes' tierd) and the relays' user publish their own role's events
only: neither can speak for a node. Every refusal is checked twice: the server reports the
violation, and nothing arrives. Then the real feed, the relay's frames and the real index meet
over that server as their own users."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from crescent.nats_config import RELAY, write_nats_auth
from services.kvindex.config import KvIndexSettings
from services.kvindex.main import KvIndexService
from services.kvindex.relay import RelayStream
from shared import subjects
from shared.bus import NatsBus
from shared.kv_event_feed import ChainBlock, KvEventFeed
from shared.kv_events import encode_batch
from tests.plane import conftest
from tests.plane.conftest import NODES, connect, deliver
from tests.support.nats import NatsServer
from tests.support.wait import wait_for_condition

EXT = subjects.KV_EXTERNAL
#: A tierd pod's id where its user is the role's (a DaemonSet pod is named after no ordinal).
TIERD_POD = "crescent-tierd-x7k2p"

Row = tuple[str, str, str]
# (sender, receiver, subject): what must get through
ALLOWED: list[Row] = [
    ("prefill-0", "kvindex", subjects.kv_events("prefill", "prefill-0")),
    ("prefill-1", "kvindex", subjects.kv_events("prefill", "prefill-1")),
    ("decode-0", "kvindex", subjects.kv_events("decode", "decode-0")),
    ("tierd-host", "kvindex", subjects.kv_events("tierd", "tierd-host")),
    ("kvindex", "prefill-0", subjects.kv_resyncs("prefill", "prefill-0")),
    ("kvindex", "decode-1", subjects.kv_resyncs("decode", "decode-1")),
    ("kvindex", "tierd-host", subjects.kv_resyncs("tierd", "tierd-host")),
]
# (sender, receiver, subject): events or resend requests in another's name or role
FORGED: list[Row] = [
    ("prefill-0", "kvindex", subjects.kv_events("prefill", "prefill-1")),
    ("decode-1", "kvindex", subjects.kv_events("decode", "decode-0")),
    ("decode-0", "kvindex", subjects.kv_events("prefill", "prefill-0")),
    ("prefill-1", "kvindex", subjects.kv_events("tierd", "tierd-host")),
    ("tierd-host", "kvindex", subjects.kv_events("decode", "decode-0")),
    # Its own id under another role.
    ("prefill-0", "kvindex", subjects.kv_events("decode", "prefill-0")),
    ("tierd-host", "kvindex", subjects.kv_events("prefill", "tierd-host")),
    ("decode-0", "kvindex", subjects.kv_events(EXT, "decode-0")),
    ("gateway-0", "kvindex", subjects.kv_events("prefill", "prefill-0")),
    ("scheduler-0", "kvindex", subjects.kv_events("decode", "decode-0")),
    # kvindex reads events; it cannot make them up.
    ("kvindex", "kvindex", subjects.kv_events("prefill", "prefill-0")),
    ("decode-0", "prefill-0", subjects.kv_resyncs("prefill", "prefill-0")),
    ("gateway-0", "tierd-host", subjects.kv_resyncs("tierd", "tierd-host")),
]


@pytest.fixture(scope="module")
def shared_users(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """The deployment's nodes, plus the users a role's replicas share: Kubernetes' tierd and
    the relays'."""
    directory = Path(tmp_path_factory.mktemp("nats-shared"))
    auth = write_nats_auth(directory / "auth", nodes=NODES, roles=("tierd", RELAY))
    nats_server = NatsServer.start(directory, auth=auth)
    try:
        yield nats_server
    finally:
        nats_server.stop()


# The same for the users a role's replicas share: Kubernetes' tierd and the relays'.
SHARED_ALLOWED: list[Row] = [
    ("tierd", "kvindex", subjects.kv_events("tierd", TIERD_POD)),
    ("kvindex", "tierd", subjects.kv_resyncs("tierd", TIERD_POD)),
    (RELAY, "kvindex", subjects.kv_events(EXT, "vllm-a")),
    (RELAY, "kvindex", subjects.kv_events(EXT, "vllm-b")),
]
SHARED_FORGED: list[Row] = [
    ("tierd", "kvindex", subjects.kv_events("prefill", "prefill-0")),
    ("tierd", "kvindex", subjects.kv_events("decode", TIERD_POD)),
    ("tierd", "kvindex", subjects.kv_events(EXT, "vllm-a")),
    (RELAY, "kvindex", subjects.kv_events("prefill", "prefill-0")),
    (RELAY, "kvindex", subjects.kv_events("tierd", "tierd-host")),
    (RELAY, "prefill-0", subjects.kv_resyncs("prefill", "prefill-0")),
    (RELAY, "gateway-0", subjects.heartbeats("decode", "decode-0")),
]


def _cases(where: str, allowed: list[Row], forged: list[Row]) -> list[tuple[object, ...]]:
    return [(where, *r, True) for r in allowed] + [(where, *r, False) for r in forged]


@pytest.mark.parametrize(
    ("where", "sender", "receiver", "subject", "allowed"),
    _cases("server", ALLOWED, FORGED) + _cases("shared_users", SHARED_ALLOWED, SHARED_FORGED),
)
def test_a_publisher_speaks_only_for_itself_and_a_shared_user_for_its_role(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    sender: str,
    receiver: str,
    subject: str,
    allowed: bool,
) -> None:
    if where == "shared_users":
        # The plane's helpers take a role's name for its first node; here "tierd" is the user.
        monkeypatch.delitem(conftest.AS_ROLE, "tierd")
    running: NatsServer = request.getfixturevalue(where)
    got, refused = asyncio.run(deliver(running, sender, receiver, subject, allowed))
    assert (got, refused) == (allowed, not allowed)


@pytest.mark.parametrize(
    "subject", [subjects.KV_EVENTS_ALL, subjects.kv_resyncs(EXT, "vllm-a"), "_INBOX.>", ">"]
)
def test_the_relays_user_hears_nothing(shared_users: NatsServer, subject: str) -> None:
    async def scenario() -> None:
        async with connect(shared_users, RELAY) as relay:
            await relay.nc.subscribe(subject)
            assert await relay.refused(subject)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("prefill-0", subjects.KV_EVENTS_ALL),
        ("decode-0", subjects.kv_events("decode", "decode-1")),
        ("gateway-0", subjects.KV_EVENTS_ALL),
        ("tools", subjects.KV_EVENTS_ALL),
        ("decode-1", subjects.kv_resyncs("decode", "decode-0")),
        ("decode-0", subjects.kv_resyncs("prefill", "decode-0")),
        ("kvindex", subjects.kv_resyncs("prefill", "prefill-0")),
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
    [
        subjects.REQUESTS,
        subjects.ABORTS,
        subjects.heartbeats("decode", "decode-0"),
        subjects.heartbeats("kvindex", "kvindex-2"),
        "x",
    ],
)
def test_kvindex_publishes_nothing_but_resend_requests_and_its_heartbeat(
    server: NatsServer, subject: str
) -> None:
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
        feed = KvEventFeed(node_bus, "decode", "decode-0")
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
            await wait_for_condition(lambda: "decode.decode-0" in views, "decode-0 folded")
            assert views["decode.decode-0"].last_seq == 1
            await wait_for_condition(feed.take_resend, "kvindex's resend request at the feed")
            assert service.handlers.resyncs_asked == 1
            assert service.handlers.frames["folded"] == 1
        finally:
            await service.stop()
            await node_bus.close()

    asyncio.run(scenario())


def test_a_relays_frames_reach_the_index_as_external_events(shared_users: NatsServer) -> None:
    """The relay's user publishes what the relay makes of an engine's batches; kvindex folds
    them under the engine's external name."""

    async def scenario() -> None:
        relay_bus = await NatsBus.connect(
            shared_users.url, "crescent-kvindex-relay", **shared_users.connect_options(RELAY)
        )
        index_bus = await NatsBus.connect(
            shared_users.url, "crescent-kvindex", **shared_users.connect_options("kvindex")
        )
        service = KvIndexService(KvIndexSettings(kvindex_port=0, dev_mode=True), index_bus)
        await service.start()
        try:
            await index_bus.flush()
            stream = RelayStream("vllm-a")
            batch = encode_batch([])
            for seq in (0, 1):
                frame = stream.frame(seq.to_bytes(8, "big"), batch)
                await relay_bus.publish(stream.subject, frame)
            views = service.index.publishers

            def folded() -> int:
                view = views.get(f"{EXT}.vllm-a")
                return -1 if view is None else view.last_seq

            await wait_for_condition(lambda: folded() == 1, "the relayed frames folded")
            assert service.handlers.frames == {"folded": 2}
        finally:
            await service.stop()
            await relay_bus.close()

    asyncio.run(scenario())
