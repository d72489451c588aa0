"""Pulls between two processes over each transport: data, counters, concurrency and failures."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from shared.transfer.base import TransferClient, TransferError, create_client, create_server
from tests.transfer.conftest import PeerProcess
from tests.transfer.peer import LEASE, SLOW_S, Blocks, block_bytes_of

BLOCK = 1_474_560  # the default model's block: 32 tokens of fp32 KV


def zeros(n: int, nbytes: int = BLOCK) -> list[np.ndarray]:
    return [np.zeros(nbytes, dtype=np.uint8) for _ in range(n)]


def assert_blocks(dest: list[np.ndarray], ids: list[int]) -> None:
    for buf, block_id in zip(dest, ids, strict=True):
        assert np.array_equal(buf, block_bytes_of(block_id, BLOCK))


def test_pull_fills_every_destination_and_counts(run: asyncio.Runner, peer: PeerProcess) -> None:
    client = create_client(peer.kind)
    ids = [5, 0, 9, 3, 15, 7, 1, 12]
    dest = zeros(len(ids))
    got = run.run(client.pull(peer.address, LEASE, ids, dest))
    assert got == len(ids) * BLOCK
    assert_blocks(dest, ids)
    # memoryviews are as good as arrays, and a second pull reuses the connection
    views = [memoryview(bytearray(BLOCK)) for _ in range(2)]
    assert run.run(client.pull(peer.address, LEASE, [2, 2], views)) == 2 * BLOCK
    assert bytes(views[0]) == bytes(views[1]) == block_bytes_of(2, BLOCK).tobytes()
    assert (client.bytes_received, client.blocks_received) == (10 * BLOCK, 10)
    run.run(client.close())


def test_concurrent_pulls_do_not_mix_up(run: asyncio.Runner, peer: PeerProcess) -> None:
    client = create_client(peer.kind)
    batches = [[i, (i + 5) % 16, (i + 11) % 16] for i in range(8)]
    dests = [zeros(3) for _ in batches]

    async def pull_all() -> list[int]:
        pulls = (
            client.pull(peer.address, LEASE, b, d) for b, d in zip(batches, dests, strict=True)
        )
        return await asyncio.gather(*pulls)

    assert run.run(pull_all()) == [3 * BLOCK] * len(batches)
    for batch, dest in zip(batches, dests, strict=True):
        assert_blocks(dest, batch)
    assert client.blocks_received == 3 * len(batches)


@pytest.mark.parametrize(
    ("lease", "nbytes", "match"),
    [
        ("no-such-lease", BLOCK, "unknown"),
        ("broken", BLOCK, "provider"),
        (LEASE, BLOCK - 1, "size"),
        (LEASE, BLOCK + 4096, "size"),
    ],
    ids=["unknown-lease", "provider-error", "dest-too-small", "dest-too-large"],
)
def test_refused_pull_raises_then_the_stack_goes_on(
    run: asyncio.Runner, peer: PeerProcess, lease: str, nbytes: int, match: str
) -> None:
    client = create_client(peer.kind, timeout_s=5.0)
    dest = zeros(1, nbytes)
    with pytest.raises(TransferError, match=match):
        run.run(client.pull(peer.address, lease, [4], dest))
    assert not dest[0].any()  # a refused pull leaves its buffers alone
    assert client.blocks_received == 0
    ok = zeros(2)
    run.run(client.pull(peer.address, LEASE, [4, 6], ok))
    assert_blocks(ok, [4, 6])


def test_bad_arguments_fail_before_any_io(run: asyncio.Runner, peer: PeerProcess) -> None:
    client = create_client(peer.kind)
    with pytest.raises(TransferError, match="destination"):
        run.run(client.pull(peer.address, LEASE, [1, 2], zeros(1)))
    with pytest.raises(TransferError, match="read-only"):
        run.run(client.pull(peer.address, LEASE, [1], [memoryview(bytes(BLOCK))]))
    with pytest.raises(TransferError, match="address"):
        other = b"ucx:x" if peer.kind == "tcp" else b"tcp:127.0.0.1:1"
        run.run(client.pull(other, LEASE, [1], zeros(1)))


def test_stalled_server_times_out_and_never_writes_late(
    run: asyncio.Runner, peer: PeerProcess
) -> None:
    client = create_client(peer.kind)
    dest = zeros(2)
    start = time.monotonic()
    with pytest.raises(TransferError, match="timed out"):
        run.run(client.pull(peer.address, "slow", [1, 2], dest, timeout_s=0.4))
    assert time.monotonic() - start < 1.4
    # The stalled server's own delay must pass for it to answer the abandoned pull: scenario
    # time, during which a late write would land.
    run.run(asyncio.sleep(SLOW_S))
    assert not any(d.any() for d in dest)
    ok = zeros(3)
    run.run(client.pull(peer.address, LEASE, [1, 2, 3], ok))
    assert_blocks(ok, [1, 2, 3])


def test_dead_server_fails_pulls_within_the_timeout(run: asyncio.Runner, peer: PeerProcess) -> None:
    doomed = PeerProcess(peer.kind)
    client = create_client(peer.kind, timeout_s=2.0)
    ids, dest = list(range(16)), zeros(16)
    run.run(client.pull(doomed.address, LEASE, ids, dest, timeout_s=10.0))
    doomed.kill()
    start = time.monotonic()
    with pytest.raises(TransferError):
        run.run(client.pull(doomed.address, LEASE, [0, 1], zeros(2)))
    assert time.monotonic() - start < 3.0
    ok = zeros(2)  # other servers are unaffected
    run.run(client.pull(peer.address, LEASE, [8, 9], ok))
    assert_blocks(ok, [8, 9])


def test_tcp_server_dying_mid_stream_fails_the_pull(run: asyncio.Runner) -> None:
    # TCP here; a UCX server dying mid-pull is tested with both sides in child processes
    # (test_peer_death), since without error handling UCX would abort the pulling process.
    doomed = PeerProcess("tcp")
    client = create_client("tcp", timeout_s=2.0)
    ids, dest = list(range(16)), zeros(16)
    killed_at: list[float] = []

    def kill() -> None:
        killed_at.append(time.monotonic())
        doomed.kill()

    async def pull_until_it_dies() -> float:
        while True:
            try:
                await client.pull(doomed.address, LEASE, ids, dest)
            except TransferError:
                if killed_at:
                    return time.monotonic() - killed_at[0]
                raise

    threading.Timer(0.3, kill).start()  # pulls run back to back: most likely mid-stream
    assert run.run(asyncio.wait_for(pull_until_it_dies(), 20.0)) < 3.0


def test_in_process_server_counts_what_it_sends(run: asyncio.Runner, peer: PeerProcess) -> None:
    async def scenario(client: TransferClient) -> tuple[int, int]:
        server = create_server(peer.kind, Blocks(4, BLOCK))
        await server.start()
        try:
            dest = zeros(3)
            await client.pull(server.address, LEASE, [3, 1, 0], dest)
            assert_blocks(dest, [3, 1, 0])
            with pytest.raises(TransferError):
                await client.pull(server.address, "no-such-lease", [0], zeros(1))
            return server.bytes_sent, server.blocks_sent
        finally:
            await server.close()

    assert run.run(scenario(create_client(peer.kind))) == (3 * BLOCK, 3)
