"""The catalogue: the write-through core of cachemeta.

Every change goes to the database first and to the in-memory index after the database committed
it, so the index is never ahead of the database; at start the index is rebuilt from the database.
Matches read only the index. Changes run one at a time, each to its end even if its caller is
cancelled, so a caller's deadline cannot leave the index behind a committed change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from services.cachemeta.index import PrefixIndex
from services.cachemeta.repository import NodeRecord, Repository
from services.cachemeta.serial import SerialChanges
from shared.rpc.types import BlockRecord, CatalogueStats, NodeInfo, PrefixHolder, TierCapacity

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LoadReport:
    num_nodes: int
    num_holders: int
    num_replicas: int
    seconds: float


class Catalogue:
    """Owns the index and the node table, and keeps both equal to the database.

    Invariants: every replica in the index is committed in the database; a node that lost
    replicas without asking (new epoch, silence longer than ``replica_grace_s``) has
    ``needs_resync`` set until it registers with ``replace``.
    """

    def __init__(
        self,
        repository: Repository,
        *,
        replica_grace_s: float,
        node_forget_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.repository = repository
        self.replica_grace_s = replica_grace_s
        self.node_forget_s = node_forget_s
        self.clock = clock
        self.index = PrefixIndex()
        self.nodes: dict[str, NodeRecord] = {}
        # When each node was last heard from, even if its heartbeat could not be saved: a
        # database outage must not make live nodes look silent.
        self._heard: dict[str, float] = {}
        self._changes = SerialChanges()
        self._touches: dict[bytes, tuple[int, float]] = {}  # hash -> (accesses, last), unsaved
        self._started_at = clock()

    async def load(self) -> LoadReport:
        """Rebuilds the node table and the index from the database."""
        started = time.perf_counter()
        index = PrefixIndex()
        nodes = {n.node_id: n for n in await self.repository.load_nodes()}
        sizes, by_holder = await asyncio.gather(
            self.repository.load_block_sizes(), self.repository.load_replicas()
        )
        replicas = sum(index.add(holder, hashes, sizes) for holder, hashes in by_holder.items())
        holders = len(by_holder)
        del sizes, by_holder
        self.index, self.nodes = index, nodes
        # Nodes could not heartbeat while this service was down: their grace starts now.
        self._started_at = self.clock()
        return LoadReport(len(nodes), holders, replicas, time.perf_counter() - started)

    def match(self, chain: Sequence[bytes], tiers: Collection[str] = ()) -> list[PrefixHolder]:
        return self.index.match(chain, tiers)

    def match_counts(
        self, chain: Sequence[bytes], tiers: Collection[str] = ()
    ) -> list[tuple[str, str, int]]:
        """``match`` as ``(node_id, tier, num_blocks)`` tuples, for the servicer."""
        return self.index.match_counts(chain, tiers)

    async def register(
        self, node_id: str, tier: str, records: Sequence[BlockRecord], *, replace_all: bool
    ) -> int:
        """Adds the node's replicas; returns how many it did not have. ``replace_all``: they are
        its whole content of ``tier``, and it is in sync again."""
        unique = list({r.block_hash: r for r in records}.values())

        async def change() -> int:
            now = self.clock()
            node = self.nodes.get(node_id)
            if node is None:  # registering before its first heartbeat: its epoch is unknown
                node = NodeRecord(node_id, "", "", now, needs_resync=True)
            if replace_all:
                node = replace(node, needs_resync=False)
            await self.repository.register(node, tier, unique, replace=replace_all, now=now)
            holder = (node_id, tier)
            hashes = [r.block_hash for r in unique]
            sizes = {r.block_hash: r.num_bytes for r in unique}
            if replace_all:
                before = self.index.blocks_of(holder)
                self.index.remove_holder(holder)
                added = sum(1 for h in hashes if h not in before)
                self.index.add(holder, hashes, sizes)
            else:
                added = self.index.add(holder, hashes, sizes)
            self.nodes[node_id] = node
            return added

        return await self._exclusive(change)

    async def drop(self, node_id: str, tier: str, block_hashes: Sequence[bytes]) -> int:
        """Removes the node's replicas; returns how many of them it had."""
        unique = list(dict.fromkeys(block_hashes))
        if not unique:
            return 0

        async def change() -> int:
            # The database gets every hash, not only those the index knows: after a commit
            # whose acknowledgement was lost, it may hold a replica the index does not.
            await self.repository.drop(node_id, tier, unique)
            return self.index.remove((node_id, tier), unique)

        return await self._exclusive(change)

    def touch(self, block_hashes: Sequence[bytes]) -> int:
        """Records an access of each known block per time it is listed; returns how many of
        the listed hashes were known.

        Accesses are counted in memory and written by ``flush_touches``: the scheduler touches
        every placed prompt, and a database write per placement would cap placements at the
        database's pace. Access statistics may lag by a flush interval; nothing else waits.
        """
        now = self.clock()
        known = [h for h in block_hashes if self.index.contains(h)]
        for block_hash in known:  # a hash listed twice is two accesses
            count, _ = self._touches.get(block_hash, (0, now))
            self._touches[block_hash] = (count + 1, now)
        return len(known)

    async def flush_touches(self) -> int:
        """Writes the accesses counted since the last flush; on failure they are kept for the
        next one. Returns how many blocks were written."""
        pending, self._touches = self._touches, {}
        if not pending:
            return 0
        accesses = [(h, n, t) for h, (n, t) in pending.items()]
        try:
            await self._exclusive(lambda: self.repository.touch(accesses))
        except BaseException:
            for block_hash, (count, at) in pending.items():
                newer, last = self._touches.get(block_hash, (0, at))
                self._touches[block_hash] = (count + newer, max(at, last))
            raise
        return len(accesses)

    async def heartbeat(
        self, node_id: str, role: str, epoch: str, tiers: Sequence[TierCapacity]
    ) -> bool:
        """Records that the node is alive; returns whether it must resync. A new epoch (the
        node restarted) drops every replica of the old one."""
        self._heard[node_id] = self.clock()

        async def change() -> bool:
            now = self.clock()
            old = self.nodes.get(node_id)
            restarted = old is not None and old.epoch not in ("", epoch)
            if old is None or restarted:
                node = NodeRecord(node_id, role, epoch, now, needs_resync=True, tiers=list(tiers))
            else:
                node = replace(old, role=role, epoch=epoch, last_seen=now, tiers=list(tiers))
            await self.repository.save_node(node, drop_replicas=restarted)
            if restarted:
                dropped = self.index.remove_node(node_id)
                log.info("node %s has a new epoch %s: dropped %d replicas", node_id, epoch, dropped)
            self.nodes[node_id] = node
            return node.needs_resync

        return await self._exclusive(change)

    async def sweep(self) -> list[str]:
        """Drops the replicas of nodes silent longer than the grace period (they must resync),
        and forgets nodes silent longer than ``node_forget_s``. Returns the nodes swept."""

        async def change() -> list[str]:
            now = self.clock()
            swept: list[str] = []
            forget: list[str] = []
            for node in list(self.nodes.values()):
                heard = self._heard.get(node.node_id, 0.0)
                silent_s = now - max(node.last_seen, heard, self._started_at)
                if silent_s > self.node_forget_s:
                    forget.append(node.node_id)
                elif silent_s > self.replica_grace_s and (
                    not node.needs_resync or self.index.holders_of(node.node_id)
                ):
                    await self.repository.drop_node_replicas(node.node_id)
                    dropped = self.index.remove_node(node.node_id)
                    self.nodes[node.node_id] = replace(node, needs_resync=True)
                    swept.append(node.node_id)
                    log.warning(
                        "node %s silent %.1f s: dropped %d replicas",
                        node.node_id,
                        silent_s,
                        dropped,
                    )
            if forget:
                await self.repository.forget_nodes(forget)
                for node_id in forget:
                    self.index.remove_node(node_id)
                    del self.nodes[node_id]
                    self._heard.pop(node_id, None)
            return swept

        return await self._exclusive(change)

    def list_nodes(self) -> list[NodeInfo]:
        counts = self.index.replica_counts()
        return [
            NodeInfo(
                node_id=n.node_id,
                role=n.role,
                epoch=n.epoch,
                last_seen_unix=n.last_seen,
                tiers=list(n.tiers),
                num_replicas=counts.get(n.node_id, 0),
            )
            for n in sorted(self.nodes.values(), key=lambda n: n.node_id)
        ]

    def stats(self) -> CatalogueStats:
        """From memory, which holds what the database holds (``Repository.stats`` counts the
        same in the database, slowly)."""
        return CatalogueStats(
            num_blocks=len(self.index),
            num_replicas=self.index.num_replicas,
            num_nodes=len(self.nodes),
            replica_bytes=self.index.replica_bytes,
        )

    async def _exclusive(self, change: Callable[[], Awaitable[T]]) -> T:
        return await self._changes.run(change)

    async def drain(self) -> None:
        """Waits for the changes already started (at shutdown)."""
        await self._changes.drain()
