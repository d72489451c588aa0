"""A holder's watch of the keep ledger: a new view per version, in order; an unreadable ledger
leaves the last view standing."""

from __future__ import annotations

import asyncio

from shared.kv.keep_watch import KeepWatch
from shared.rpc.client import CacheMetaUnavailable
from shared.rpc.types import KeepListing


class Ledger:
    """Answers ``list_keeps`` from a scripted list of versions, or fails while ``down``."""

    def __init__(self) -> None:
        self.version = 1
        self.keeps: dict[bytes, float] = {}
        self.down = False
        self.asked: list[int] = []

    async def list_keeps(self, version: int = 0) -> KeepListing:
        self.asked.append(version)
        if self.down:
            raise CacheMetaUnavailable("cachemeta is away")
        if version == self.version:
            return KeepListing(version, False)
        return KeepListing(self.version, True, dict(self.keeps))


def test_each_new_version_is_told_once_and_an_outage_changes_nothing() -> None:
    ledger = Ledger()
    told: list[dict[bytes, float]] = []

    async def on_keeps(keeps: dict[bytes, float], asked_at: float) -> None:
        assert asked_at > 0
        told.append(keeps)

    async def scenario() -> None:
        watch = KeepWatch(ledger, on_keeps, interval_s=0.01)
        ledger.keeps = {b"a" * 16: 100.0}
        assert await watch.poll() and not await watch.poll()
        ledger.down = True
        assert not await watch.poll()
        assert watch.keeps == {b"a" * 16: 100.0}
        ledger.down, ledger.version, ledger.keeps = False, 2, {}
        assert await watch.poll()

    asyncio.run(scenario())
    assert told == [{b"a" * 16: 100.0}, {}]
    assert ledger.asked == [0, 1, 1, 1]
