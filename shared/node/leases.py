"""Which blocks a node holds for a pull (a finished prefill's KV, or cached blocks pinned for a
peer), and until when. Pure bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Lease:
    lease_id: str
    request_id: str
    block_ids: list[int]
    expires_at: float
    pinned: bool = False  # cached blocks pinned for a peer, not a finished request's blocks


@dataclass(slots=True)
class LeaseTable:
    """Owns the live leases. Invariant: a lease is here until it is released, aborted or
    expired, and each of those happens once: ``pop`` and ``expire`` return a lease at most once,
    so its blocks are freed exactly once."""

    ttl_s: float
    leases: dict[str, Lease] = field(default_factory=dict)

    def grant(
        self,
        lease_id: str,
        request_id: str,
        block_ids: list[int],
        now: float,
        pinned: bool = False,
    ) -> Lease:
        lease = Lease(lease_id, request_id, list(block_ids), now + self.ttl_s, pinned)
        self.leases[lease_id] = lease
        return lease

    def pop(self, lease_id: str) -> Lease | None:
        return self.leases.pop(lease_id, None)

    def blocks_for(self, lease_id: str, block_ids: list[int], now: float) -> list[int] | None:
        """The requested blocks if the lease is live and holds every one of them."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.expires_at < now:
            return None
        held = set(lease.block_ids)
        return block_ids if all(b in held for b in block_ids) else None

    def expire(self, now: float) -> list[Lease]:
        gone = [lease for lease in self.leases.values() if lease.expires_at < now]
        for lease in gone:
            del self.leases[lease.lease_id]
        return gone
