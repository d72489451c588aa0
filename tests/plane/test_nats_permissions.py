"""The generated NATS configuration on a real server: who may connect, and which role may
publish and subscribe where. Every refusal is checked twice: the server reports the violation,
and the message does not arrive."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from shared import subjects
from shared.bus import NatsBus
from tests.plane.conftest import AS_ROLE, connect, received
from tests.support.nats import NatsServer
from tests.support.wait import DEFAULT_TIMEOUT_S


def test_a_client_without_credentials_or_with_a_wrong_password_is_refused(
    server: NatsServer,
) -> None:
    async def scenario() -> None:
        for options in ({}, {"user": "gateway", "password": "not-the-password"}):
            with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                await nats.connect(server.url, allow_reconnect=False, connect_timeout=2, **options)

    asyncio.run(scenario())


def test_a_prefill_node_cannot_read_tokens_nor_submit_requests(server: NatsServer) -> None:
    async def scenario() -> None:
        async with (
            connect(server, "prefill") as prefill,
            connect(server, "decode") as decode,
            connect(server, "scheduler") as scheduler,
        ):
            stolen: list[bytes] = []

            async def steal(msg: Msg) -> None:
                stolen.append(msg.data)

            await prefill.nc.subscribe(f"{subjects.PREFIX}.tokens.>", cb=steal)
            assert await prefill.refused(f"{subjects.PREFIX}.tokens.>")
            await decode.nc.publish(subjects.tokens("req-1"), b"secret completion")

            submitted: list[bytes] = []

            async def take(msg: Msg) -> None:
                submitted.append(msg.data)

            await scheduler.nc.subscribe(subjects.REQUESTS, queue=subjects.SCHEDULER_QUEUE, cb=take)
            await scheduler.sync()
            await prefill.nc.publish(subjects.REQUESTS, b"forged request")
            assert await prefill.refused(subjects.REQUESTS)
            assert not await received(stolen, timeout_s=0.3)
            assert not await received(submitted, timeout_s=0.3)

    asyncio.run(scenario())


def test_a_node_heartbeats_only_as_itself(server: NatsServer) -> None:
    async def scenario() -> None:
        async with connect(server, "decode") as decode, connect(server, "gateway") as gateway:
            beats: list[str] = []

            async def on_beat(msg: Msg) -> None:
                beats.append(msg.subject)

            await gateway.nc.subscribe(subjects.HEARTBEATS_ALL, cb=on_beat)
            await gateway.sync()
            await decode.nc.publish(subjects.heartbeats("prefill", "x"), b"{}")
            assert await decode.refused(subjects.heartbeats("prefill", "x"))
            # Nor as another node of its own role.
            await decode.nc.publish(subjects.heartbeats("decode", "decode-1"), b"{}")
            assert await decode.refused(subjects.heartbeats("decode", "decode-1"))
            await decode.nc.publish(subjects.heartbeats("decode", "decode-0"), b"{}")
            assert await received(beats)
            # The server keeps one publisher's order: a forged beat let through would have
            # arrived before this one, so no window of waiting is needed.
            assert beats == [subjects.heartbeats("decode", "decode-0")]

    asyncio.run(scenario())


@pytest.mark.parametrize(("user", "may_abort"), [("prefill", True), ("decode", False)])
def test_only_the_roles_that_abort_may_publish_aborts(
    server: NatsServer, user: str, may_abort: bool
) -> None:
    async def scenario() -> None:
        async with connect(server, user) as node, connect(server, "decode") as listener:
            aborts: list[bytes] = []

            async def on_abort(msg: Msg) -> None:
                aborts.append(msg.data)

            await listener.nc.subscribe(subjects.ABORTS, cb=on_abort)
            await listener.sync()
            await node.nc.publish(subjects.ABORTS, b"{}")
            window = DEFAULT_TIMEOUT_S if may_abort else 0.5  # short where none should come
            assert await received(aborts, timeout_s=window) is may_abort
            assert await node.refused(subjects.ABORTS, timeout_s=0.3) is not may_abort

    asyncio.run(scenario())


def test_the_scheduler_takes_requests_only_in_its_queue_group(server: NatsServer) -> None:
    async def scenario() -> None:
        async with connect(server, "scheduler") as scheduler:
            await scheduler.nc.subscribe(subjects.REQUESTS)
            assert await scheduler.refused(subjects.REQUESTS)

    asyncio.run(scenario())


def test_nobody_reads_another_roles_replies_or_answers_unasked(server: NatsServer) -> None:
    async def scenario() -> None:
        async with connect(server, "prefill") as prefill, connect(server, "decode") as decode:
            await prefill.nc.subscribe("_INBOX.gateway-0.>")
            assert await prefill.refused("_INBOX.gateway-0.>")
            await prefill.nc.subscribe("_INBOX.prefill-1.>")  # nor its own role's
            assert await prefill.refused("_INBOX.prefill-1.>")
            # allow_responses: a reply only to a request the responder received.
            await decode.nc.publish("_INBOX.gateway-0.abc.1", b"forged reply")
            assert await decode.refused("_INBOX.gateway-0.abc.1")

    asyncio.run(scenario())


@pytest.mark.parametrize("user", ["gateway", "scheduler", "prefill", "decode", "tierd", "tools"])
def test_no_role_can_forge_a_disconnect_event(server: NatsServer, user: str) -> None:
    async def scenario() -> None:
        async with connect(server, user) as conn:
            await conn.nc.publish(subjects.DISCONNECTS, b"{}")
            assert await conn.refused(subjects.DISCONNECTS)

    asyncio.run(scenario())


def test_tools_only_watch_heartbeats(server: NatsServer) -> None:
    async def scenario() -> None:
        async with connect(server, "tools") as tools:
            await tools.nc.subscribe(subjects.HEARTBEATS_ALL)
            await tools.nc.publish(subjects.ABORTS, b"{}")
            assert await tools.refused(subjects.ABORTS)
            await tools.nc.subscribe(subjects.ABORTS)
            assert await tools.refused(subjects.ABORTS)
            assert not any(subjects.HEARTBEATS_ALL in e for e in tools.errors)

    asyncio.run(scenario())


async def answer(msg: Msg) -> None:
    await msg.respond(b"ack:" + msg.data)


# (requester, responder, the subject for an id, the responder listens on every id, queue group)
ROUND_TRIPS: list[tuple[str, str, Callable[[str], str], bool, str]] = [
    ("gateway", "scheduler", lambda _: subjects.REQUESTS, False, subjects.SCHEDULER_QUEUE),
    ("scheduler", "prefill", subjects.prefill_tasks, False, ""),
    ("prefill", "decode", subjects.decode_tasks, False, ""),
    ("prefill", "decode", subjects.peer_pins, False, ""),
    ("prefill", "prefill", subjects.peer_pins, False, ""),
    ("decode", "prefill", subjects.peer_pins, False, ""),
    ("gateway", "prefill", subjects.replays, False, ""),
    ("gateway", "decode", subjects.replays, False, ""),
    ("prefill", "gateway", subjects.gateway_checks, False, ""),
    ("decode", "gateway", subjects.gateway_checks, False, ""),
    ("tierd", "prefill", subjects.sinks, False, ""),
    ("tierd", "decode", subjects.sinks, False, ""),
    ("prefill", "tierd", subjects.peer_pins, False, ""),
    ("decode", "tierd", subjects.peer_pins, False, ""),
]


@pytest.mark.parametrize(("requester", "responder", "subject", "wildcard", "queue"), ROUND_TRIPS)
def test_allowed_request_reply_round_trips(
    server: NatsServer,
    requester: str,
    responder: str,
    subject: Callable[[str], str],
    wildcard: bool,
    queue: str,
) -> None:
    # A subject that names a node names the responder: nothing else is delivered to it.
    target = subject(AS_ROLE[responder])

    async def scenario() -> None:
        async with connect(server, responder) as serving, connect(server, requester) as asking:
            await serving.nc.subscribe(subject("*") if wildcard else target, queue=queue, cb=answer)
            await serving.sync()
            reply = await asking.nc.request(target, b"hello", timeout=2)
            assert reply.data == b"ack:hello"
            assert not serving.errors and not asking.errors

    asyncio.run(scenario())


def test_the_bus_connects_with_the_credentials_and_its_inbox(server: NatsServer) -> None:
    async def scenario() -> None:
        async with connect(server, "scheduler") as scheduler:
            await scheduler.nc.subscribe(
                subjects.REQUESTS, queue=subjects.SCHEDULER_QUEUE, cb=answer
            )
            await scheduler.sync()
            bus = await NatsBus.connect(
                server.url, "crescent-gateway-0", **server.connect_options("gateway-0")
            )
            try:
                assert bus.connected
                reply = await bus.nc.request(subjects.REQUESTS, b"x", timeout=2)
                assert reply.data == b"ack:x"
            finally:
                await bus.close()

    asyncio.run(scenario())


def test_a_node_user_cannot_connect_under_another_nodes_id(server: NatsServer) -> None:
    async def scenario() -> None:
        with pytest.raises(ValueError, match="NATS user is 'decode-1'"):
            await NatsBus.connect(
                server.url, "crescent-decode-0", **server.connect_options("decode-1")
            )

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("decode-1", subjects.decode_tasks("decode-0")),
        ("decode-1", subjects.peer_pins("decode-0")),
        ("decode-1", subjects.replays("decode-0")),
        ("decode-1", subjects.lease_releases("decode-0")),
        ("decode-1", subjects.local_tasks("decode-0")),
        ("prefill-1", subjects.prefill_tasks("prefill-0")),
        ("prefill-1", subjects.sinks("prefill-0")),
        ("gateway-0", subjects.gateway_checks("gateway-1")),
    ],
)
def test_no_node_reads_what_is_addressed_to_another(
    server: NatsServer, user: str, subject: str
) -> None:
    """Hand-offs (prompts, stream keys), pins, replays and lease tokens of one node are out of
    reach of every other node, of the same role too."""

    async def scenario() -> None:
        async with connect(server, user) as other:
            await other.nc.subscribe(subject)
            assert await other.refused(subject)

    asyncio.run(scenario())
