"""A stand-in for ``CacheMetaClient``: the scheduler's calls, with scripted answers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from shared.rpc.types import KeepGrant, PrefixHolder


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
        # Keeps: each call's arguments, the grant to answer (None: every keep is granted, all
        # of its blocks new) and the error to raise instead.
        self.keeps: list[tuple[bytes, list[bytes], float, bool, int]] = []
        self.keep_grant: KeepGrant | None = None
        self.keep_error: Exception | None = None

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

    async def keep_blocks(
        self,
        quota_key: bytes,
        block_hashes: Sequence[bytes],
        *,
        ttl_s: float = 0.0,
        pin: bool = False,
        max_blocks: int = 0,
    ) -> KeepGrant:
        self.keeps.append((quota_key, list(block_hashes), ttl_s, pin, max_blocks))
        if self.keep_error is not None:
            raise self.keep_error
        if self.keep_grant is not None:
            return self.keep_grant
        return KeepGrant(True, len(block_hashes), list(block_hashes))

    async def close(self) -> None:
        self.closed = True
