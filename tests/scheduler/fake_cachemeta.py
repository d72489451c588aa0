"""A stand-in for ``CacheMetaClient``: the scheduler's two calls, with scripted answers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from shared.rpc.types import PrefixHolder


class FakeCacheMeta:
    """Answers ``match_prefix`` with ``holders`` (those in the tiers asked for) after
    ``delay_s``, or raises ``error``; records every call. Invariant: ``matches`` and
    ``touches`` hold the hashes of every call, in order, and ``tiers`` the tiers of every
    match."""

    def __init__(
        self,
        holders: Sequence[PrefixHolder] = (),
        *,
        error: Exception | None = None,
        touch_error: Exception | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.holders = list(holders)
        self.error = error
        self.touch_error = touch_error
        self.delay_s = delay_s
        self.matches: list[list[bytes]] = []
        self.timeouts: list[float | None] = []
        self.tiers: list[tuple[str, ...]] = []
        self.touches: list[list[bytes]] = []
        self.closed = False

    async def match_prefix(
        self,
        block_hashes: Sequence[bytes],
        *,
        tiers: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> list[PrefixHolder]:
        self.matches.append(list(block_hashes))
        self.timeouts.append(timeout_s)
        self.tiers.append(tuple(tiers))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return [h for h in self.holders if not tiers or h.tier in tiers]

    async def touch_blocks(self, block_hashes: Sequence[bytes]) -> int:
        self.touches.append(list(block_hashes))
        if self.touch_error is not None:
            raise self.touch_error
        return len(block_hashes)

    async def close(self) -> None:
        self.closed = True
