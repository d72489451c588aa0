"""The keep ledger: which blocks each tenant asked to keep, until when, within its quota.

Every holder of blocks (the nodes' pools, tierd's tiers) reads the ledger and spares the blocks
it keeps from eviction; the scheduler writes it before it places a request that asks for a
keep, so an over-quota keep is refused before anything is computed. Write-through like the
catalogue: the database first, the memory after it committed, one change at a time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from services.cachemeta.repository import KeepRow, Repository
from services.cachemeta.serial import SerialChanges
from shared.rpc.types import KeepGrant


@dataclass(frozen=True, slots=True)
class KeepPlan:
    """What one keep call changes: rows to write, and the hashes newly kept."""

    granted: bool
    num_kept: int
    rows: list[KeepRow]
    new: list[bytes]


class KeepLedger:
    """Owns the keeps in memory (hash -> row) and the ledger's version. Pure: no I/O.

    Invariants: a hash has at most one row (hashes are scoped to a tenant, so it is that
    tenant's); a row is in force while pinned or before its ``until``; ``version`` changes
    with every change of the rows (an expiry changes nothing: readers compare times).
    """

    def __init__(self, rows: Sequence[KeepRow] = (), version: int | None = None) -> None:
        self.rows: dict[bytes, KeepRow] = {r.block_hash: r for r in rows}
        # Starts from the clock, so a restarted ledger never repeats a version a reader holds.
        self.version = time.time_ns() if version is None else version

    @staticmethod
    def in_force(row: KeepRow, now: float) -> bool:
        return row.pinned or row.until > now

    def num_kept(self, quota_key: bytes, now: float) -> int:
        return sum(
            1 for r in self.rows.values() if r.quota_key == quota_key and self.in_force(r, now)
        )

    def plan(
        self,
        quota_key: bytes,
        hashes: Sequence[bytes],
        until: float,
        max_blocks: int,
        now: float,
    ) -> KeepPlan:
        """The rows a keep until ``until`` (``math.inf``: pinned) writes: each block keeps
        the later of its times (a pin stays a pin). Refused, writing nothing, when the
        tenant's kept blocks would then exceed ``max_blocks``."""
        kept = self.num_kept(quota_key, now)
        rows: list[KeepRow] = []
        new: list[bytes] = []
        for block_hash in dict.fromkeys(hashes):
            old = self.rows.get(block_hash)
            if old is not None and old.quota_key != quota_key:
                continue  # another scope's hash: never this tenant's to keep
            live = old is not None and self.in_force(old, now)
            if not live:
                new.append(block_hash)
            rows.append(_merged(old if live else None, block_hash, quota_key, until))
        if kept + len(new) > max_blocks:
            return KeepPlan(False, kept, [], [])
        return KeepPlan(True, kept + len(new), rows, new)

    def apply(self, rows: Sequence[KeepRow], gone: Sequence[bytes] = ()) -> None:
        for block_hash in gone:
            self.rows.pop(block_hash, None)
        for row in rows:
            self.rows[row.block_hash] = row
        if rows or gone:
            self.version += 1

    def owned(self, quota_key: bytes, hashes: Sequence[bytes]) -> list[bytes]:
        """The hashes among ``hashes`` the tenant has rows for."""
        rows = self.rows
        return [h for h in hashes if (r := rows.get(h)) is not None and r.quota_key == quota_key]

    def expired(self, now: float) -> list[bytes]:
        return [h for h, r in self.rows.items() if not self.in_force(r, now)]

    def listing(self, now: float) -> dict[bytes, float]:
        """The keeps in force: hash -> the unix time each ends (``math.inf``: pinned)."""
        return {
            h: math.inf if r.pinned else r.until
            for h, r in self.rows.items()
            if self.in_force(r, now)
        }


def _merged(old: KeepRow | None, block_hash: bytes, quota_key: bytes, until: float) -> KeepRow:
    if math.isinf(until) or (old is not None and old.pinned):
        return KeepRow(block_hash, quota_key, 0.0, True)
    return KeepRow(block_hash, quota_key, max(until, old.until if old else 0.0), False)


class Keeps:
    """Owns the ledger and keeps it equal to the database's keeps.

    Invariant: the ledger holds only what the database committed; changes run one at a time,
    each to its end even if its caller is cancelled.
    """

    def __init__(self, repository: Repository, clock: Callable[[], float] = time.time) -> None:
        self.repository = repository
        self.clock = clock
        self.ledger = KeepLedger()
        self._changes = SerialChanges()

    async def load(self) -> int:
        self.ledger = KeepLedger(await self.repository.load_keeps())
        return len(self.ledger.rows)

    async def keep(
        self,
        quota_key: bytes,
        hashes: Sequence[bytes],
        *,
        ttl_s: float,
        pin: bool,
        max_blocks: int,
    ) -> KeepGrant:
        """Keeps (``pin``, or for ``ttl_s`` seconds) or, with neither, drops the tenant's
        keeps of ``hashes``; see ``KeepLedger.plan``."""

        async def change() -> KeepGrant:
            now = self.clock()
            if not pin and ttl_s <= 0:
                gone = self.ledger.owned(quota_key, hashes)
                await self.repository.save_keeps([], gone)
                self.ledger.apply([], gone)
                return KeepGrant(True, self.ledger.num_kept(quota_key, now))
            until = math.inf if pin else now + ttl_s
            plan = self.ledger.plan(quota_key, hashes, until, max_blocks, now)
            if plan.granted:
                await self.repository.save_keeps(plan.rows)
                self.ledger.apply(plan.rows)
            return KeepGrant(plan.granted, plan.num_kept, plan.new)

        return await self._changes.run(change)

    async def purge(self) -> int:
        """Deletes the rows whose keeps ended; returns how many."""

        async def change() -> int:
            gone = self.ledger.expired(self.clock())
            if gone:
                await self.repository.save_keeps([], gone)
                self.ledger.apply([], gone)
            return len(gone)

        return await self._changes.run(change)

    def num_in_force(self) -> int:
        return len(self.ledger.listing(self.clock()))

    def listing(self, version: int) -> tuple[int, bool, dict[bytes, float]]:
        """``(version, changed, keeps in force)``; no keeps when ``version`` is current."""
        current = self.ledger.version
        if version == current:
            return current, False, {}
        return current, True, self.ledger.listing(self.clock())

    async def drain(self) -> None:
        await self._changes.drain()
