"""Failures around cachemeta: its database going away, its server going away, a hung server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from shared.rpc import client as client_module
from shared.rpc.client import CacheMetaClient, CacheMetaUnavailable
from shared.rpc.types import PrefixHolder
from tests.cachemeta.chains import chain, hashes
from tests.cachemeta.conftest import Postgres, Served, count_sweeps, settings_for
from tests.support.loop import BackgroundLoop
from tests.support.nats import free_port
from tests.support.wait import wait_for_condition

TOKENS = list(range(200, 240))


@pytest.fixture
def served_pg(bg_loop: BackgroundLoop, postgres: Postgres) -> Iterator[Served]:
    postgres.truncate()
    s = Served(bg_loop, settings_for(postgres.url)).start()
    yield s
    postgres.admin(f'ALTER DATABASE "{postgres.name}" ALLOW_CONNECTIONS true')
    s.close()


def test_terminated_database_connections_are_replaced(
    served_pg: Served, postgres: Postgres
) -> None:
    client = served_pg.client
    assert client is not None
    blocks = chain(TOKENS)
    served_pg.call(client.register_blocks("n1", "dram", blocks[:5]))
    for step in range(3):
        [killed] = postgres.admin(postgres.terminate_sql())
        assert killed, "the service held no database connection to terminate"
        served_pg.call(client.register_blocks("n1", "dram", blocks[5 + step : 6 + step]))
        assert served_pg.call(client.stats()).num_replicas == 6 + step
    assert served_pg.call(client.match_prefix(hashes(blocks))) == [PrefixHolder("n1", "dram", 8)]


def test_database_down_for_a_while(served_pg: Served, postgres: Postgres) -> None:
    client = served_pg.client
    assert client is not None
    blocks = chain(TOKENS)
    served_pg.call(client.register_blocks("n1", "dram", blocks[:4]))
    postgres.admin(
        f'ALTER DATABASE "{postgres.name}" ALLOW_CONNECTIONS false', postgres.terminate_sql()
    )

    async def while_down() -> None:
        for call in (
            lambda: client.register_blocks("n1", "dram", blocks[4:]),
            lambda: client.drop_blocks("n1", "dram", hashes(blocks[:1])),
            lambda: client.heartbeat("n1", "prefill", "e1"),
        ):
            started = time.monotonic()
            with pytest.raises(CacheMetaUnavailable, match="database"):
                await call()
            assert time.monotonic() - started < 3.0
        # Accesses are counted in memory and kept until a flush can write them.
        assert await client.touch_blocks(hashes(blocks[1:2])) == 1
        with pytest.raises(Exception, match="not currently accepting connections"):
            await served_pg.service.catalogue.flush_touches()
        # Reads are answered from memory, and nothing refused reached the index.
        assert await client.match_prefix(hashes(blocks)) == [PrefixHolder("n1", "dram", 4)]
        assert (await client.stats()).num_replicas == 4
        assert [n.num_replicas for n in await client.list_nodes()] == [4]

    served_pg.call(while_down())
    assert served_pg.service.catalogue.repository.errors >= 3  # the metrics' database errors
    postgres.admin(f'ALTER DATABASE "{postgres.name}" ALLOW_CONNECTIONS true')

    async def back() -> None:
        assert await client.register_blocks("n1", "dram", blocks[4:]) == 6
        assert await client.drop_blocks("n1", "dram", hashes(blocks[:1])) == 1
        assert (await client.stats()).num_replicas == 9
        # The access counted during the outage is written once the database is back.
        catalogue = served_pg.service.catalogue
        await catalogue.flush_touches()
        row = await catalogue.repository.block(blocks[1].block_hash)
        assert row is not None and row["access_count"] == 1

    served_pg.call(back())
    served_pg.restart()  # the database agrees with what was answered
    assert served_pg.call(client.match_prefix(hashes(blocks[1:]))) == [
        PrefixHolder("n1", "dram", 9)
    ]


def test_nodes_beating_through_a_database_outage_keep_their_replicas(
    bg_loop: BackgroundLoop, postgres: Postgres
) -> None:
    postgres.truncate()
    settings = settings_for(postgres.url, replica_grace_s=0.8, sweep_interval_s=0.1)
    served = Served(bg_loop, settings).start()
    client = served.client
    assert client is not None
    blocks = chain(TOKENS)
    sweeps = count_sweeps(served)

    async def beat_for(seconds: float, node: str) -> None:
        for _ in range(int(seconds / 0.1)):
            with contextlib.suppress(CacheMetaUnavailable):
                await client.heartbeat(node, "prefill", "e1")
            await asyncio.sleep(0.1)  # the node's heartbeat period, part of the scenario

    try:
        served.call(client.heartbeat("n1", "prefill", "e1"))
        served.call(client.register_blocks("n1", "dram", blocks, replace=True))
        postgres.admin(
            f'ALTER DATABASE "{postgres.name}" ALLOW_CONNECTIONS false', postgres.terminate_sql()
        )
        served.call(beat_for(1.6, "n1"))  # every heartbeat fails: it cannot be saved
        postgres.admin(f'ALTER DATABASE "{postgres.name}" ALLOW_CONNECTIONS true')
        # Sweeps run again; the last saved heartbeat is older than the grace, the last one
        # heard is not.
        before = sweeps[0]
        served.call(wait_for_condition(lambda: sweeps[0] > before, "a sweep after the outage"))
        assert served.call(client.match_prefix(hashes(blocks))) == [PrefixHolder("n1", "dram", 10)]
        assert not served.call(client.heartbeat("n1", "prefill", "e1"))
    finally:
        postgres.admin(f'ALTER DATABASE "{postgres.name}" ALLOW_CONNECTIONS true')
        served.close()


def test_no_server_fails_fast(bg_loop: BackgroundLoop) -> None:
    client = CacheMetaClient(f"127.0.0.1:{free_port()}", timeout_s=5.0)

    async def scenario() -> None:
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(CacheMetaUnavailable, match="UNAVAILABLE"):
                await client.match_prefix([b"\x00" * 16])
            assert time.monotonic() - started < 1.0
        await client.close()

    bg_loop.run(scenario())


def test_hung_server_fails_at_the_deadline(bg_loop: BackgroundLoop) -> None:
    timeout_s = 1.0
    with socket.socket() as listener:  # accepts connections, never speaks HTTP/2
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        target = f"127.0.0.1:{listener.getsockname()[1]}"
        client = CacheMetaClient(target, timeout_s=timeout_s, max_in_flight=1)

        async def scenario() -> list[float]:
            async def timed() -> float:
                started = time.monotonic()
                with pytest.raises(CacheMetaUnavailable):
                    await client.stats()
                return time.monotonic() - started

            # The second call waits for the only slot: its wait counts against its deadline.
            elapsed = await asyncio.gather(timed(), timed())
            await client.close()
            return list(elapsed)

        elapsed = bg_loop.run(scenario())
        assert min(elapsed) > 0.8 * timeout_s  # each ran to its deadline
        # Both end together: a wait kept out of the deadline would end the second a whole
        # timeout later (compared with each other, not with a wall-clock bound).
        assert max(elapsed) - min(elapsed) < timeout_s / 2


def test_a_connection_slower_than_a_call_is_kept_for_the_next_call(
    bg_loop: BackgroundLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call whose deadline ends while its channel is still connecting leaves the channel
    to finish (a short lookup budget on a loaded host must not start every call from
    scratch); a channel connecting for longer than the grace is replaced."""
    with socket.socket() as listener:  # accepts connections, never finishes the handshake
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.5)
        client = CacheMetaClient(f"127.0.0.1:{listener.getsockname()[1]}", timeout_s=0.2)
        accepted: list[socket.socket] = []

        def fail_once() -> None:
            with pytest.raises(CacheMetaUnavailable):
                bg_loop.run(client.stats())
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])

        try:
            fail_once()
            fail_once()
            assert len(accepted) == 1  # the second call waited on the first one's connection
            monkeypatch.setattr(client_module, "CONNECT_GRACE_S", 0.0)
            fail_once()  # replaces the channel on failing
            fail_once()
            assert len(accepted) == 2
        finally:
            bg_loop.run(client.close())
            for conn in accepted:
                conn.close()


def test_client_survives_a_server_restart(bg_loop: BackgroundLoop, tmp_path: object) -> None:
    served = Served(bg_loop, settings_for(f"sqlite+aiosqlite:///{tmp_path}/cm.db")).start()
    client = served.client
    assert client is not None
    blocks = chain(TOKENS)
    try:
        served.call(client.register_blocks("n1", "dram", blocks))
        served.stop()
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(CacheMetaUnavailable):
                served.call(client.match_prefix(hashes(blocks)))
            assert time.monotonic() - started < 1.0
        # Long enough for gRPC's reconnect backoff to grow, were the channel kept: time that
        # must pass in the scenario, not synchronisation.
        served.call(asyncio.sleep(1.5))
        served.start()  # same port
        assert served.call(client.match_prefix(hashes(blocks))) == [PrefixHolder("n1", "dram", 10)]
    finally:
        served.close()
