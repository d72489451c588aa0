"""The catalogue's database statements: SQLAlchemy async Core, the same code for Postgres
(asyncpg) and SQLite (aiosqlite) except the two bulk reads of a reload, which let Postgres
aggregate into arrays. Each public method is one transaction.

A block row exists while at least one replica of it does: every statement that removes
replicas also removes the blocks it left without one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from sqlalchemy import LargeBinary, Table, bindparam, delete, exists, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.cachemeta.database import from_signed64, to_signed64
from services.cachemeta.models import Block, Keep, Node, Replica
from shared.errors import CrescentError
from shared.rpc.types import BlockRecord, CatalogueStats, TierCapacity

log = logging.getLogger(__name__)

T = TypeVar("T")
Holder = tuple[str, str]
nodes = cast(Table, Node.__table__)
blocks = cast(Table, Block.__table__)
replicas = cast(Table, Replica.__table__)
keeps = cast(Table, Keep.__table__)
# Rows per executemany batch and hashes per IN list: far below the 32,767 bind parameters
# asyncpg (and SQLite >= 3.32) accept in one statement.
CHUNK = 2000
LOAD_BATCH = 50_000


class DatabaseUnavailable(CrescentError):
    """The catalogue database could not be reached or failed the statement."""


@dataclass(slots=True)
class NodeRecord:
    """A node row: who it is, when it was last heard of, and whether it must resync."""

    node_id: str
    role: str
    epoch: str
    last_seen: float
    needs_resync: bool
    tiers: list[TierCapacity] = field(default_factory=list)


def _chunks(items: Sequence[T], size: int = CHUNK) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Repository:
    """Owns the statements run on one engine. Invariants: every method commits all of its
    changes or none (a connection lost mid-way is retried once on a fresh connection); every
    replica's block and node rows exist (the schema has no foreign keys to check it)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._postgres = engine.dialect.name == "postgresql"
        self._insert = pg_insert if self._postgres else sqlite_insert
        self.errors = 0  # statements that failed on the database since start

    async def load_nodes(self) -> list[NodeRecord]:
        rows = await self._run(lambda c: c.execute(select(nodes)), write=False)
        return [_node_from_row(r._mapping) for r in rows]

    async def load_block_sizes(self) -> dict[bytes, int]:
        """Every block's size in bytes."""
        if self._postgres:  # one array per size: nothing to do per row in Python
            hashes = func.array_agg(blocks.c.hash, type_=ARRAY(LargeBinary, as_tuple=True))
            query = select(blocks.c.num_bytes, hashes).group_by(blocks.c.num_bytes)
            rows = await self._run(lambda c: c.execute(query), write=False)
            return {h: int(size) for size, group in rows for h in group}

        async def scan(conn: AsyncConnection) -> dict[bytes, int]:
            sizes: dict[bytes, int] = {}
            query = select(blocks.c.hash, blocks.c.num_bytes).execution_options(
                yield_per=LOAD_BATCH
            )
            async for rows in (await conn.stream(query)).partitions():
                sizes.update(rows)
            return sizes

        return await self._run(scan, write=False)

    async def load_replicas(self) -> dict[Holder, list[bytes]]:
        """Every replica, by holder, in one pass over the table (a query per holder would read
        most of the table once per holder: a node's replicas lie all over it)."""
        if self._postgres:  # one array per holder, decoded by the driver
            hashes = func.array_agg(replicas.c.block_hash, type_=ARRAY(LargeBinary, as_tuple=True))
            query = select(replicas.c.node_id, replicas.c.tier, hashes).group_by(
                replicas.c.node_id, replicas.c.tier
            )
            rows = await self._run(lambda c: c.execute(query), write=False)
            return {(node_id, tier): list(group) for node_id, tier, group in rows}

        async def scan(conn: AsyncConnection) -> dict[Holder, list[bytes]]:
            by_holder: dict[Holder, list[bytes]] = {}
            query = select(replicas.c.node_id, replicas.c.tier, replicas.c.block_hash)
            result = await conn.stream(query.execution_options(yield_per=LOAD_BATCH))
            async for rows in result.partitions():
                for node_id, tier, block_hash in rows:
                    held = by_holder.get((node_id, tier))
                    if held is None:
                        held = by_holder[(node_id, tier)] = []
                    held.append(block_hash)
            return by_holder

        return await self._run(scan, write=False)

    async def save_node(self, node: NodeRecord, *, drop_replicas: bool = False) -> None:
        """Inserts or updates the node row; with ``drop_replicas`` its replicas go too."""

        async def work(conn: AsyncConnection) -> None:
            values = _node_values(node)
            stmt = self._insert(nodes).values(values)
            keys = {k: v for k, v in values.items() if k != "node_id"}
            await conn.execute(stmt.on_conflict_do_update(index_elements=["node_id"], set_=keys))
            if drop_replicas:
                await self._drop_node_replicas(conn, node.node_id)

        await self._run(work)

    async def drop_node_replicas(self, node_id: str) -> None:
        """Removes every replica of the node and marks it as needing a resync."""

        async def work(conn: AsyncConnection) -> None:
            await self._drop_node_replicas(conn, node_id)
            mark = update(nodes).where(nodes.c.node_id == node_id).values(needs_resync=True)
            await conn.execute(mark)

        await self._run(work)

    async def forget_nodes(self, node_ids: Sequence[str]) -> None:
        async def work(conn: AsyncConnection) -> None:
            for node_id in node_ids:
                await self._drop_node_replicas(conn, node_id)
                await conn.execute(delete(nodes).where(nodes.c.node_id == node_id))

        await self._run(work)

    async def register(
        self,
        node: NodeRecord,
        tier: str,
        records: Sequence[BlockRecord],
        *,
        replace: bool,
        now: float,
    ) -> None:
        """Adds the blocks (if new) and the node's replicas of them in ``tier``; with
        ``replace`` the node's other replicas in that tier go. ``node`` is saved as given."""
        block_rows = [
            {
                "hash": r.block_hash,
                "parent_hash": r.parent_hash,
                "num_bytes": r.num_bytes,
                "checksum": to_signed64(r.checksum),
                "created_at": now,
                "last_access": now,
                "access_count": 0,
            }
            for r in records
        ]
        replica_rows = [
            {"block_hash": r.block_hash, "node_id": node.node_id, "tier": tier} for r in records
        ]

        async def work(conn: AsyncConnection) -> None:
            values = _node_values(node)
            keys = {k: v for k, v in values.items() if k != "node_id"}
            upsert = self._insert(nodes).values(values)
            await conn.execute(upsert.on_conflict_do_update(index_elements=["node_id"], set_=keys))
            removed: list[bytes] = []
            if replace:
                old = delete(replicas).where(
                    replicas.c.node_id == node.node_id, replicas.c.tier == tier
                )
                result = await conn.execute(old.returning(replicas.c.block_hash))
                removed = [bytes(r[0]) for r in result]
            for block_chunk in _chunks(block_rows):
                await conn.execute(self._insert(blocks).on_conflict_do_nothing(), block_chunk)
            for replica_chunk in _chunks(replica_rows):
                await conn.execute(self._insert(replicas).on_conflict_do_nothing(), replica_chunk)
            if removed:
                kept = {r.block_hash for r in records}
                await self._delete_orphans(conn, [h for h in removed if h not in kept])

        await self._run(work)

    async def drop(self, node_id: str, tier: str, block_hashes: Sequence[bytes]) -> None:
        async def work(conn: AsyncConnection) -> None:
            for chunk in _chunks(block_hashes):
                await conn.execute(
                    delete(replicas).where(
                        replicas.c.node_id == node_id,
                        replicas.c.tier == tier,
                        replicas.c.block_hash.in_(chunk),
                    )
                )
            await self._delete_orphans(conn, block_hashes)

        await self._run(work)

    async def touch(self, accesses: Sequence[tuple[bytes, int, float]]) -> None:
        """Adds ``count`` accesses to each block and sets its last access to ``at``, for
        ``(block_hash, count, at)`` in ``accesses``; unknown blocks are skipped."""
        stmt = (
            update(blocks)
            .where(blocks.c.hash == bindparam("h"))
            .values(access_count=blocks.c.access_count + bindparam("n"), last_access=bindparam("t"))
        )

        async def work(conn: AsyncConnection) -> None:
            for chunk in _chunks(accesses):
                await conn.execute(stmt, [{"h": h, "n": n, "t": t} for h, n, t in chunk])

        await self._run(work)

    async def stats(self) -> CatalogueStats:
        joined = replicas.join(blocks, blocks.c.hash == replicas.c.block_hash)
        query = select(
            select(func.count()).select_from(blocks).scalar_subquery(),
            select(func.count()).select_from(replicas).scalar_subquery(),
            select(func.count()).select_from(nodes).scalar_subquery(),
            select(func.coalesce(func.sum(blocks.c.num_bytes), 0))
            .select_from(joined)
            .scalar_subquery(),
        )
        row = (await self._run(lambda c: c.execute(query), write=False)).one()
        return CatalogueStats(int(row[0]), int(row[1]), int(row[2]), int(row[3]))

    async def block(self, block_hash: bytes) -> dict[str, Any] | None:
        """One block row with its values decoded (for tests and tools)."""
        query = select(blocks).where(blocks.c.hash == block_hash)
        row = (await self._run(lambda c: c.execute(query), write=False)).first()
        if row is None:
            return None
        values = dict(row._mapping)
        values["checksum"] = from_signed64(values["checksum"])
        return values

    async def load_keeps(self) -> list[KeepRow]:
        rows = await self._run(lambda c: c.execute(select(keeps)), write=False)
        return [
            KeepRow(bytes(r.hash), bytes(r.quota_key), float(r.until), bool(r.pinned)) for r in rows
        ]

    async def save_keeps(self, rows: Sequence[KeepRow], gone: Sequence[bytes] = ()) -> None:
        """Writes ``rows`` (inserted or updated) and deletes the keeps of ``gone``, in one
        transaction."""
        values = [
            {"hash": r.block_hash, "quota_key": r.quota_key, "until": r.until, "pinned": r.pinned}
            for r in rows
        ]
        upsert = self._insert(keeps)
        upsert = upsert.on_conflict_do_update(
            index_elements=["hash"],
            set_={
                "quota_key": upsert.excluded.quota_key,
                "until": upsert.excluded.until,
                "pinned": upsert.excluded.pinned,
            },
        )

        async def work(conn: AsyncConnection) -> None:
            for chunk in _chunks(list(gone)):
                await conn.execute(delete(keeps).where(keeps.c.hash.in_(chunk)))
            for value_chunk in _chunks(values):
                await conn.execute(upsert, value_chunk)

        await self._run(work)

    async def _drop_node_replicas(self, conn: AsyncConnection, node_id: str) -> None:
        stmt = delete(replicas).where(replicas.c.node_id == node_id)
        result = await conn.execute(stmt.returning(replicas.c.block_hash))
        await self._delete_orphans(conn, list({bytes(r[0]) for r in result}))

    async def _delete_orphans(self, conn: AsyncConnection, block_hashes: Sequence[bytes]) -> None:
        held = exists().where(replicas.c.block_hash == blocks.c.hash)
        for chunk in _chunks(block_hashes):
            await conn.execute(delete(blocks).where(blocks.c.hash.in_(chunk), ~held))

    async def _run(self, work: Callable[[AsyncConnection], Awaitable[T]], write: bool = True) -> T:
        for attempt in (1, 2):
            try:
                async with self.engine.connect() as conn:
                    result = await work(conn)
                    if write:
                        await conn.commit()
                    return result
            except DBAPIError as exc:
                self.errors += 1
                if exc.connection_invalidated and attempt == 1:
                    log.warning("database connection lost, retrying once: %s", exc.orig)
                    continue
                raise DatabaseUnavailable(f"catalogue database error: {exc.orig}") from exc
            except (SQLAlchemyError, OSError) as exc:
                self.errors += 1
                raise DatabaseUnavailable(f"catalogue database error: {exc}") from exc
        raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class KeepRow:
    """A keep row: ``block_hash`` kept for ``quota_key`` until ``until`` or, ``pinned``, for
    good."""

    block_hash: bytes
    quota_key: bytes
    until: float
    pinned: bool


def _node_values(node: NodeRecord) -> dict[str, Any]:
    return {
        "node_id": node.node_id,
        "role": node.role,
        "epoch": node.epoch,
        "last_seen": node.last_seen,
        "needs_resync": node.needs_resync,
        "tiers": [
            {"tier": t.tier, "capacity_bytes": t.capacity_bytes, "used_bytes": t.used_bytes}
            for t in node.tiers
        ],
    }


def _node_from_row(row: Any) -> NodeRecord:
    return NodeRecord(
        node_id=row["node_id"],
        role=row["role"],
        epoch=row["epoch"],
        last_seen=float(row["last_seen"]),
        needs_resync=bool(row["needs_resync"]),
        tiers=[
            TierCapacity(t["tier"], t["capacity_bytes"], t["used_bytes"])
            for t in row["tiers"] or []
        ],
    )
