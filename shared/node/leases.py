"""Blocks a node holds for someone else's pull, under one table of leases of three kinds: a
finished prefill's KV for its decode node, cached blocks pinned for a peer, and cold blocks
offered to the host's tierd. Pure bookkeeping, no I/O."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from enum import Enum


class LeaseKind(Enum):
    HANDOFF = "handoff"  # a prefill's KV held until its decode node pulled it
    PEER_PIN = "peer_pin"  # cached blocks pinned for a peer's prefix pull
    SINK_OFFER = "sink_offer"  # cold blocks pinned while tierd copies them down


@dataclass(slots=True)
class Lease:
    """Blocks held for one pull. ``token`` is the only credential a puller has;
    ``request_id`` is set for a hand-off only."""

    token: str
    kind: LeaseKind
    request_id: str
    block_ids: list[int]
    expires_at: float

    @property
    def pinned(self) -> bool:
        """Its blocks are pinned cached blocks (not a request's own)."""
        return self.kind is not LeaseKind.HANDOFF


class LeaseTable:
    """Owns the node's leases.

    Invariants: a lease is returned by ``release``, ``release_all`` or ``expire`` at most
    once, so its blocks are let go exactly once; a lease serves only the blocks it was
    granted, and only until it expires.
    """

    def __init__(self, lease_ttl_s: float) -> None:
        self.lease_ttl_s = lease_ttl_s
        self._leases: dict[str, Lease] = {}

    def grant(
        self, kind: LeaseKind, now: float, block_ids: list[int] | None = None, request_id: str = ""
    ) -> Lease:
        """A lease on ``block_ids`` (filled in later for a pin) under a fresh random token."""
        if (kind is LeaseKind.HANDOFF) != bool(request_id):
            raise ValueError("a hand-off lease names its request, and only a hand-off does")
        token = secrets.token_urlsafe(24)
        lease = Lease(token, kind, request_id, list(block_ids or ()), now + self.lease_ttl_s)
        self._leases[token] = lease
        return lease

    def release(self, token: str) -> Lease | None:
        return self._leases.pop(token, None)

    def release_all(self, request_id: str) -> list[Lease]:
        """Every lease held for ``request_id`` (an abort ends them all)."""
        gone = [lease for lease in self._leases.values() if lease.request_id == request_id]
        for lease in gone:
            del self._leases[lease.token]
        return gone

    def expire(self, now: float) -> list[Lease]:
        gone = [lease for lease in self._leases.values() if lease.expires_at < now]
        for lease in gone:
            del self._leases[lease.token]
        return gone

    def blocks_for(self, token: str, block_ids: list[int], now: float) -> list[int] | None:
        """The requested blocks if the lease is live and holds every one of them."""
        lease = self._leases.get(token)
        if lease is None or lease.expires_at < now:
            return None
        held = set(lease.block_ids)
        return block_ids if all(b in held for b in block_ids) else None

    def __len__(self) -> int:
        return len(self._leases)

    def count(self, kind: LeaseKind) -> int:
        return sum(1 for lease in self._leases.values() if lease.kind is kind)
