"""``NodeKeeps`` on its own, reading a stand-in keep ledger: a keep the ledger dropped ends
in the pool, one the ledger extended lasts longer, and an unchanged ledger changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import time

from shared.node.keeps import NodeKeeps
from shared.rpc.types import KeepListing
from tests.engine.conftest import EngineFactory
from tests.node.parts.rig import PLAIN, prompt, running_host

KEPT = dataclasses.replace(PLAIN, keep="ttl", keep_ttl_s=600.0)


class Ledger:
    """A stand-in for cachemeta's keep ledger: serves ``keeps`` at ``version``."""

    def __init__(self) -> None:
        self.version = 0
        self.keeps: dict[bytes, float] = {}
        self.reads = 0

    def publish(self, keeps: dict[bytes, float]) -> None:
        self.version += 1
        self.keeps = dict(keeps)

    async def list_keeps(self, version: int = 0) -> KeepListing:
        self.reads += 1
        if version == self.version:
            return KeepListing(version=version, changed=False)
        return KeepListing(version=self.version, changed=True, keeps=dict(self.keeps))


def test_the_pool_follows_the_ledger(make_engine: EngineFactory) -> None:
    async def scenario() -> None:
        engine = make_engine()
        engine.generate([prompt(1)], KEPT)
        blocks = engine.keeps.blocks()
        hashes = [b.block_hash for b in blocks]
        assert len(hashes) == 6 and all(b.ref_cnt == 1 for b in blocks)
        ledger = Ledger()
        async with running_host(engine) as (host, _):
            keeps = NodeKeeps(host, ledger)
            later = time.time() + 3600.0
            # Elsewhere the first three were extended and the rest dropped.
            ledger.publish({h: later for h in hashes[:3] if h is not None})
            await keeps.tick()
            assert keeps.keeps_ended == 3
            assert [engine.keeps.until(h) for h in hashes[:3] if h is not None] == [later] * 3
            assert all(h not in engine.keeps for h in hashes[3:])
            assert [b.ref_cnt for b in blocks] == [1, 1, 1, 0, 0, 0]
            # The dropped blocks stay cached: only their keep ended.
            assert all(engine.pool.get_cached_block(h) is not None for h in hashes if h)

            reads = ledger.reads
            await keeps.tick()  # the same version: nothing to follow
            assert ledger.reads == reads + 1 and keeps.keeps_ended == 3
            assert len(engine.keeps) == 3

    asyncio.run(scenario())
