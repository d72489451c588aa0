"""kvindex beats like the other services: on a real server with the generated users, a running
kvindex's heartbeat reaches the gateway's user as a NodeStatus of role ``kvindex``, the
gateway's status document lists it after the tiers' daemons, and `crescent status` prints its
line."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console

from crescent.status import render
from services.gateway.status import StatusBoard
from services.kvindex.config import KvIndexSettings
from services.kvindex.main import KvIndexService
from shared import subjects
from shared.bus import NatsBus
from shared.cluster_messages import NodeStatus
from tests.support.nats import NatsServer
from tests.support.wait import wait_for_condition


def test_kvindex_beats_and_the_status_page_lists_it(server: NatsServer) -> None:
    board = StatusBoard()
    heard: list[str] = []

    async def on_beat(subject: str, status: NodeStatus) -> None:
        heard.append(subject)
        board.beat(status, time.monotonic())

    async def scenario() -> None:
        gateway = await NatsBus.connect(
            server.url, "crescent-gateway-0", **server.connect_options("gateway-0")
        )
        await gateway.watch(subjects.HEARTBEATS_ALL, NodeStatus, on_beat)
        await gateway.flush()
        index_bus = await NatsBus.connect(
            server.url, "crescent-kvindex", **server.connect_options("kvindex")
        )
        settings = KvIndexSettings(kvindex_port=0, dev_mode=True, heartbeat_interval_s=0.1)
        service = KvIndexService(settings, index_bus)
        await service.start()
        try:
            await wait_for_condition(lambda: len(heard) >= 2, "two beats of kvindex")
        finally:
            await service.stop()
            await gateway.close()
        assert set(heard) == {subjects.heartbeats("kvindex", "kvindex")}

    asyncio.run(scenario())
    board.beat(NodeStatus(node_id="tierd-host", role="tierd"), time.monotonic())
    doc = board.snapshot(time.monotonic(), time.time(), [], {"id": "gateway-0"})
    (listed,) = [n for n in doc["nodes"] if n["role"] == "kvindex"]
    assert listed["id"] == "kvindex" and listed["health"] == "ok"
    assert [n["role"] for n in doc["nodes"]] == ["tierd", "kvindex"]
    console = Console(record=True, width=160)
    console.print(render(doc))
    line = next(row for row in console.export_text().splitlines() if "kvindex" in row)
    assert "ok" in line
