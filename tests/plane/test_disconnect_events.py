"""The server's DISCONNECT advisories reach the deployment's account as
``crescent.events.disconnect``, naming the connection that closed; and parsing them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from nats.aio.msg import Msg

from shared import subjects
from shared.liveness import Liveness
from shared.nats_events import DISCONNECT_TYPE, disconnected_name, disconnected_node
from tests.plane.conftest import connect, received
from tests.support.nats import NatsServer

# A node that connects, says so, and waits to be killed.
NODE = """
import asyncio, json, os, sys
import nats

async def main():
    nc = await nats.connect(os.environ["URL"], name=sys.argv[1], **json.loads(os.environ["AUTH"]))
    await nc.flush()
    print("connected", flush=True)
    await asyncio.sleep(60)  # alive until the test kills it

asyncio.run(main())
"""


def start_node(server: NatsServer, user: str, name: str) -> subprocess.Popen[str]:
    env = os.environ | {"URL": server.url, "AUTH": json.dumps(server.connect_options(user))}
    proc = subprocess.Popen(
        [sys.executable, "-c", NODE, name], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "connected"
    return proc


@pytest.mark.parametrize("watcher", ["gateway", "scheduler"])
def test_a_killed_node_is_reported_by_its_user_within_a_second(
    server: NatsServer, watcher: str
) -> None:
    async def scenario() -> None:
        async with connect(server, watcher) as watching:
            events: list[bytes] = []
            seen_at: list[float] = []

            async def on_event(msg: Msg) -> None:
                events.append(msg.data)
                seen_at.append(time.monotonic())

            await watching.nc.subscribe(subjects.DISCONNECTS, cb=on_event)
            await watching.sync()
            node = await asyncio.to_thread(start_node, server, "prefill-1", "crescent-prefill-1")
            killed_at = time.monotonic()
            node.kill()
            await asyncio.to_thread(node.wait)
            assert await received(events)
            nodes = [disconnected_node(e) for e in events]
            assert "prefill-1" in nodes
            # Told by the closed socket, not by the server's ping timeout (minutes): a bound
            # that proves it with room for a busy host.
            assert seen_at[nodes.index("prefill-1")] - killed_at < 5.0
            assert not watching.errors

    asyncio.run(scenario())


def test_nodes_are_not_told_of_disconnects(server: NatsServer) -> None:
    async def scenario() -> None:
        async with connect(server, "prefill") as prefill:
            await prefill.nc.subscribe(subjects.DISCONNECTS)
            assert await prefill.refused(subjects.DISCONNECTS)

    asyncio.run(scenario())


def advisory(**client: object) -> bytes:
    return json.dumps(
        {"type": DISCONNECT_TYPE, "client": client, "reason": "Client Closed"}
    ).encode()


def test_the_node_is_the_authenticated_user_never_the_chosen_name() -> None:
    spoof = advisory(name="crescent-decode-0", user="tools")
    assert disconnected_name(spoof) == "crescent-decode-0"  # for logs only
    assert disconnected_node(spoof) == "tools"  # names no node: liveness knows no such peer
    assert disconnected_node(advisory(name="crescent-decode-0", user="decode-0")) == "decode-0"
    assert disconnected_node(advisory(name="crescent-decode-0")) is None  # no user: no word
    assert disconnected_node(advisory(name="bench", user="")) is None


def test_a_spoofed_name_disconnecting_leaves_the_node_alive(server: NatsServer) -> None:
    """The read-only tools user names its connection after decode-0 and hangs up: the
    advisory carries the server's word (user tools), so a watcher's liveness keeps decode-0."""
    view = Liveness(timeout_s=30.0, started_at=time.monotonic())
    view.beat("decode-0", "decode", "e1", time.monotonic())

    async def scenario() -> None:
        async with connect(server, "gateway") as watching:
            events: list[bytes] = []

            async def on_event(msg: Msg) -> None:
                events.append(msg.data)
                node_id = disconnected_node(msg.data)
                if node_id is not None:
                    view.disconnected(node_id, time.monotonic())

            await watching.nc.subscribe(subjects.DISCONNECTS, cb=on_event)
            await watching.sync()
            for _ in range(3):
                async with connect(server, "tools", name="crescent-decode-0"):
                    pass
            assert await received(events, count=3)
            assert view.alive("decode-0", time.monotonic())

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'"crescent-x"',
        json.dumps(
            {"type": "io.nats.server.advisory.v1.client_connect", "client": {"name": "a"}}
        ).encode(),
        json.dumps({"type": DISCONNECT_TYPE}).encode(),
        json.dumps({"type": DISCONNECT_TYPE, "client": "crescent-x"}).encode(),
        advisory(),
        advisory(name=""),
        advisory(name=7),
    ],
)
def test_anything_malformed_is_none(payload: bytes) -> None:
    assert disconnected_name(payload) is None
    assert disconnected_node(payload) is None
