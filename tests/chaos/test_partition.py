"""A decode node cut off by the network in the middle of its streams (its own network
namespace, the veth link taken down): nothing closes, its heartbeats just stop. Every stream
completes elsewhere without a token lost or repeated, and once the link is back the node holds
nothing nobody wants."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench import partition

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(partition.supported() is not None, reason=str(partition.supported())),
]


def test_a_partitioned_decode_node_costs_the_clients_nothing(
    tmp_path: Path, cache_dir: Path
) -> None:
    async def scenario() -> tuple[partition.Tally, float]:
        part = partition.start(tmp_path, cache_dir)
        try:
            harness = await partition.open_partitioned(part)
            try:
                return await partition.partition(harness)
            finally:
                await harness.beats.close()
                await harness.client.close()
        finally:
            partition.stop(part)

    with partition.namespace():
        tally, stale_s = asyncio.run(scenario())
    assert tally.errors == () and tally.completed == tally.sent == 6, tally
    assert (tally.duplicated, tally.missing) == (0, 0), tally
    # The heartbeat timeout (3 s), then the resume, which computes the prompt and the tokens
    # so far again on the other node: 11 s with one of the two cores held by another process.
    assert tally.recovery_s < 20
    assert stale_s < 5
