"""What tierd holds below DRAM, as its policies see it: every block, the tiers it is in, how
it is used, and whose quota it counts against. Pure bookkeeping, no I/O, so the simulator can
drive it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from services.tierd.policy import BlockInfo, EvictionPolicy, admits, chain_depths
from services.tierd.reuse import HISTORY_PER_BLOCK, AccessHistory
from shared.kv.block_file import BlockHeader
from shared.kv.tiers import LOWER_TIERS, NVME, S3

__all__ = ["NVME", "S3", "TIERS", "Held", "Holdings"]
#: The tiers below DRAM, fastest first: blocks move down this list and are read up it.
TIERS = LOWER_TIERS
#: Dropped blocks remembered at least, however few are held.
MIN_HISTORY = 1024


@dataclass(slots=True)
class Held:
    """One block below DRAM: its header, the tiers holding a copy, and its use."""

    header: BlockHeader
    tiers: set[str] = field(default_factory=set)
    last_access: float = 0.0
    access_count: int = 0


class Holdings:
    """Owns the metadata of every block tierd holds, and each tenant's bytes.

    Invariants: a block is in ``blocks`` iff some tier holds it; ``quota_used[k]`` is the sum
    of ``num_bytes`` over the blocks of quota key ``k`` (each block once, however many tiers
    hold it), and keys with no bytes held are absent. Victims and expired blocks are chosen so
    that no held block loses a block of its prefix (a read stops at the first gap). The use of
    the last ``HISTORY_PER_BLOCK`` dropped blocks per block held (``MIN_HISTORY`` at least) is
    remembered, so a block that comes back starts from its old count plus one, as in the
    simulator's pool. A block the keep ledger keeps (``kept``: hash -> unix time its keep
    ends), and every block that leads to it, is no victim and does not expire while its keep
    is in force.
    """

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        # A learning policy (crescent) is told of each store and read.
        self._observe: Callable[[int], None] | None = getattr(policy, "observe", None)
        self.blocks: dict[bytes, Held] = {}
        self.quota_used: dict[bytes, int] = {}
        self.history = AccessHistory(MIN_HISTORY)
        self.kept: dict[bytes, float] = {}

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.blocks

    def tiers_of(self, block_hash: bytes) -> set[str]:
        held = self.blocks.get(block_hash)
        return set(held.tiers) if held is not None else set()

    def add(self, header: BlockHeader, tier: str, now: float) -> None:
        """Records a copy in ``tier``; a block new to tierd starts as just used (and, if it was
        dropped lately, with the count it had then, plus this use)."""
        held = self.blocks.get(header.block_hash)
        if held is None:
            count = self._count_on_return(self.history.recall(header.block_hash))
            held = Held(header, last_access=now, access_count=count)
            self.blocks[header.block_hash] = held
            key = header.quota_key
            if header.num_bytes > 0:
                self.quota_used[key] = self.quota_used.get(key, 0) + header.num_bytes
            if self._observe is not None:
                self._observe(count)
        held.tiers.add(tier)

    def remove(self, block_hash: bytes, tier: str) -> bool:
        """Forgets the copy in ``tier``; True if that was the block's last copy."""
        held = self.blocks.get(block_hash)
        if held is None or tier not in held.tiers:
            return False
        held.tiers.discard(tier)
        if held.tiers:
            return False
        del self.blocks[block_hash]
        self.history.capacity = max(HISTORY_PER_BLOCK * len(self.blocks), MIN_HISTORY)
        self.history.remember(block_hash, held.access_count)
        key = held.header.quota_key
        left = self.quota_used.get(key, 0) - held.header.num_bytes
        if left > 0:
            self.quota_used[key] = left
        else:
            self.quota_used.pop(key, None)
        return True

    def touch(self, block_hashes: Iterable[bytes], now: float) -> None:
        for block_hash in block_hashes:
            held = self.blocks.get(block_hash)
            if held is not None:
                held.last_access = max(held.last_access, now)
                held.access_count += 1
                if self._observe is not None:
                    self._observe(held.access_count)

    def bytes_in(self, tier: str) -> int:
        return sum(h.header.num_bytes for h in self.blocks.values() if tier in h.tiers)

    def victims(
        self,
        need_bytes: int,
        now: float,
        *,
        tier: str | None = None,
        quota_key: bytes | None = None,
    ) -> list[bytes]:
        """Blocks to evict, first first, freeing at least ``need_bytes``: among those in
        ``tier`` (any tier when None) and of ``quota_key`` (any tenant when None), as the
        policy ranks them, chains cut from the tail. Within a tier, a block whose only copy is
        there is no victim while a block it leads to is held in a faster tier: dropping it would
        cut that block off from its prefix. (NVMe's victims move down to S3 and stay held, so
        what S3 holds of a chain protects nothing on NVMe.)"""
        infos = self._infos(tier, now)
        return self.policy.victims(infos, need_bytes, now, quota_key=quota_key)

    def admits(self, header: BlockHeader, victims: list[bytes], now: float) -> bool:
        """Whether the policy ranks a new block above every block it would displace (an
        admission test: a cold block must not push out hot ones)."""
        rank = getattr(self.policy, "rank", None)
        if rank is None or not victims:
            return True
        depths = self._depths()
        parent = header.parent_hash
        candidate = BlockInfo(
            block_hash=header.block_hash,
            parent_hash=parent,
            num_bytes=header.num_bytes,
            depth=depths[parent] + 1 if parent in self.blocks else 0,
            created_at=now,
            last_access=now,
            access_count=self._count_on_return(self.history.peek(header.block_hash)),
            quota_key=header.quota_key,
        )
        infos = self._infos(None, now)
        displaced = [infos[h] for h in victims if h in infos]
        return admits(self.policy, candidate, displaced, now)  # type: ignore[arg-type]

    @staticmethod
    def _count_on_return(remembered: int | None) -> int:
        """A block new to tierd starts unread; one dropped and back has been used once more."""
        return 0 if remembered is None else remembered + 1

    def over_quota(self, quota_key: bytes, incoming_bytes: int, quota_bytes: int) -> int:
        """Bytes the tenant must give up before ``incoming_bytes`` more fit its quota."""
        return max(self.quota_used.get(quota_key, 0) + incoming_bytes - quota_bytes, 0)

    def expired(self, now: float, ttl_s: float) -> list[bytes]:
        """Blocks unused for longer than ``ttl_s`` and leading to no block still in use,
        deepest first (a chain's tail goes before its head, so no gap opens in what stays)."""
        depths = self._depths()
        children = self._children()
        kept = self.protected(now)
        gone: set[bytes] = set()
        for block_hash in sorted(self.blocks, key=lambda h: -depths.get(h, 0)):
            held = self.blocks[block_hash]
            if block_hash in kept:
                continue
            if now - held.last_access > ttl_s and children.get(block_hash, set()) <= gone:
                gone.add(block_hash)
        return sorted(gone, key=lambda h: (-depths.get(h, 0), h))

    def set_kept(self, keeps: Mapping[bytes, float]) -> None:
        """The keeps in force, as the ledger lists them (hash -> unix time each ends)."""
        self.kept = dict(keeps)

    def protected(self, now: float) -> set[bytes]:
        """The blocks held that a keep in force spares: kept ones, and every block that
        leads to one (a kept block is only reusable with its whole prefix)."""
        spared: set[bytes] = set()
        for block_hash, until in self.kept.items():
            if until <= now:
                continue
            while block_hash in self.blocks and block_hash not in spared:
                spared.add(block_hash)
                block_hash = self.blocks[block_hash].header.parent_hash
        return spared

    def _depths(self) -> dict[bytes, int]:
        return chain_depths({h: held.header.parent_hash for h, held in self.blocks.items()})

    def _children(self) -> dict[bytes, set[bytes]]:
        children: dict[bytes, set[bytes]] = {}
        for block_hash, held in self.blocks.items():
            parent = held.header.parent_hash
            if parent in self.blocks and parent != block_hash:
                children.setdefault(parent, set()).add(block_hash)
        return children

    def _pinned(self, tier: str, depths: dict[bytes, int]) -> set[bytes]:
        """The blocks held only in ``tier`` that lead to a block held in a faster tier."""
        faster = set(TIERS[: TIERS.index(tier)]) if tier in TIERS else set()
        if not faster:
            return set()
        children = self._children()
        pinned: set[bytes] = set()
        for block_hash in sorted(self.blocks, key=lambda h: -depths.get(h, 0)):
            if self.blocks[block_hash].tiers != {tier}:
                continue
            kids = children.get(block_hash, set())
            if any(k in pinned or self.blocks[k].tiers & faster for k in kids):
                pinned.add(block_hash)
        return pinned

    def _infos(self, tier: str | None, now: float) -> dict[bytes, BlockInfo]:
        # Depths over every block held, so a chain whose head moved to another tier still
        # prices its tail as deep.
        depths = self._depths()
        pinned = self._pinned(tier, depths) if tier is not None else set()
        pinned |= self.protected(now)
        chosen = {
            h: held
            for h, held in self.blocks.items()
            if (tier is None or tier in held.tiers) and h not in pinned
        }
        return {
            h: BlockInfo(
                block_hash=h,
                parent_hash=held.header.parent_hash,
                num_bytes=held.header.num_bytes,
                depth=depths.get(h, 0),
                created_at=held.header.created_at,
                last_access=held.last_access,
                access_count=held.access_count,
                quota_key=held.header.quota_key,
            )
            for h, held in chosen.items()
        }
