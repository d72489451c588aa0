"""The tierd user on a real server: it asks the nodes of its host for cold blocks and tells
them what it holds, the scheduler and the nodes reach it, and nobody else may speak for it.
Every refusal is checked twice: the server reports the violation, and nothing arrives."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from shared import subjects
from tests.plane.conftest import connect, deliver
from tests.support.nats import NatsServer

NODES = ("prefill", "decode")


# (sender, receiver, subject): messages that must get through
ALLOWED: list[tuple[str, str, str]] = [
    ("tierd", "prefill", subjects.sunk("prefill-0")),
    ("tierd", "decode", subjects.sunk("decode-0")),
    ("tierd", "prefill", subjects.lease_releases("prefill-0")),
    ("prefill", "tierd", subjects.lease_releases("tierd-host")),
    ("decode", "tierd", subjects.lease_releases("tierd-host")),
    ("scheduler", "tierd", subjects.prefetches("tierd-host")),
    ("prefill", "tierd", subjects.corrupt_reports("tierd-host")),
    ("decode", "tierd", subjects.corrupt_reports("tierd-host")),
    ("decode", "tierd", subjects.heartbeats("decode", "decode-0")),
    ("tierd", "scheduler", subjects.heartbeats("tierd", "tierd-host")),
]


@pytest.mark.parametrize(("sender", "receiver", "subject"), ALLOWED)
def test_the_tier_messages_get_through(
    server: NatsServer, sender: str, receiver: str, subject: str
) -> None:
    got, refused = asyncio.run(deliver(server, sender, receiver, subject, allowed=True))
    assert got and not refused


# (sender, subject, a receiver that listens there): what only tierd or the scheduler may send
FORGED: list[tuple[str, str, str]] = [
    ("decode", subjects.prefetches("tierd-host"), "tierd"),
    ("prefill", subjects.prefetches("tierd-host"), "tierd"),
    ("gateway", subjects.prefetches("tierd-host"), "tierd"),
    ("gateway", subjects.sinks("decode-0"), "decode"),
    ("scheduler", subjects.sinks("decode-0"), "decode"),
    ("prefill", subjects.sinks("decode-0"), "decode"),
    ("prefill", subjects.sunk("decode-0"), "decode"),
    ("decode", subjects.sunk("prefill-0"), "prefill"),
    ("gateway", subjects.corrupt_reports("tierd-host"), "tierd"),
    ("prefill", subjects.heartbeats("tierd", "tierd-host"), "scheduler"),
    ("tierd", subjects.heartbeats("decode", "decode-0"), "scheduler"),
]


@pytest.mark.parametrize(("sender", "subject", "receiver"), FORGED)
def test_nobody_else_speaks_for_tierd_or_the_scheduler(
    server: NatsServer, sender: str, subject: str, receiver: str
) -> None:
    got, refused = asyncio.run(deliver(server, sender, receiver, subject, allowed=False))
    assert refused and not got


# What tierd has no business with: requests, tasks, output, aborts and replays.
TIERD_MAY_NOT_PUBLISH: list[Callable[[], str]] = [
    lambda: subjects.REQUESTS,
    lambda: subjects.prefill_tasks("prefill-0"),
    lambda: subjects.decode_tasks("decode-0"),
    lambda: subjects.tokens("req-1"),
    lambda: subjects.ABORTS,
    lambda: subjects.replays("decode-0"),
    lambda: subjects.peer_pins("prefill-0"),
]


@pytest.mark.parametrize("subject", TIERD_MAY_NOT_PUBLISH)
def test_tierd_cannot_publish_outside_its_work(
    server: NatsServer, subject: Callable[[], str]
) -> None:
    async def scenario() -> None:
        async with connect(server, "tierd") as tierd:
            await tierd.nc.publish(subject(), b"{}")
            assert await tierd.refused(subject())

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "subject",
    [f"{subjects.PREFIX}.tokens.>", subjects.prefill_tasks("*"), subjects.sinks("*"), "_INBOX.>"],
)
def test_tierd_cannot_read_what_others_are_sent(server: NatsServer, subject: str) -> None:
    async def scenario() -> None:
        async with connect(server, "tierd") as tierd:
            await tierd.nc.subscribe(subject)
            assert await tierd.refused(subject)

    asyncio.run(scenario())


def test_tierd_watches_heartbeats_and_disconnects(server: NatsServer) -> None:
    async def scenario() -> None:
        async with connect(server, "tierd") as tierd:
            for subject in (subjects.HEARTBEATS_ALL, subjects.DISCONNECTS):
                await tierd.nc.subscribe(subject)
            await tierd.sync()
            assert not await tierd.refused(subjects.PREFIX, timeout_s=0.3)

    asyncio.run(scenario())
