"""Who is alive, from heartbeats and from NATS disconnect events. Pure: callers feed it what
the bus delivers and ask it with their own clock.

Callers feed only what the server vouches for: a heartbeat whose node id and role match the
subject it came on (NATS lets each node publish only on its own), and a disconnect by the
authenticated user (``shared.nats_events.disconnected_node``), never by connection name.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Peer:
    """The last word of one service: its heartbeat, or the end of its connection."""

    node_id: str
    role: str
    epoch: str
    last_seen: float
    healthy: bool = True
    draining: bool = False
    disconnected_at: float | None = None
    epoch_since: float = 0.0  # when this epoch was first heard


@dataclass(slots=True)
class Liveness:
    """Owns the last heartbeat of every service seen, per id.

    A peer is alive while its last heartbeat is at most ``timeout_s`` old, no disconnect of
    its connection came after that heartbeat, and (where the caller names one) its epoch is
    the one asked about: a restarted node is another process that knows nothing of its
    predecessor's requests. ``blind_until`` covers our own outages: while we could not hear
    heartbeats, silence proves nothing, so every known peer counts as seen at reconnection.
    """

    timeout_s: float = 3.0
    peers: dict[str, Peer] = field(default_factory=dict)
    started_at: float = 0.0

    def beat(
        self,
        node_id: str,
        role: str,
        epoch: str,
        now: float,
        *,
        healthy: bool = True,
        draining: bool = False,
    ) -> None:
        old = self.peers.get(node_id)
        since = old.epoch_since if old is not None and old.epoch == epoch else now
        self.peers[node_id] = Peer(node_id, role, epoch, now, healthy, draining, None, since)

    def disconnected(self, node_id: str, now: float) -> str | None:
        """Records that ``node_id``'s connection closed; returns its id if it is a known peer."""
        peer = self.peers.get(node_id)
        if peer is None:
            return None
        peer.disconnected_at = now
        return peer.node_id

    def reconnected(self, now: float) -> None:
        """Our own connection is back: what we missed meanwhile is no evidence of death."""
        for peer in self.peers.values():
            if peer.disconnected_at is None:
                peer.last_seen = max(peer.last_seen, now)

    def alive(self, node_id: str, now: float, epoch: str = "", since: float | None = None) -> bool:
        """Whether ``node_id`` (in ``epoch``, if given) is alive. ``since``: when the caller
        learnt of that epoch; a peer whose last heard epoch is older than that simply has not
        been heard in the new one yet (it gets a timeout), while one heard in another epoch
        since then has restarted."""
        peer = self.peers.get(node_id)
        if peer is None:
            # Not heard of yet: fine while we have not listened a full timeout ourselves.
            return now - self.started_at <= self.timeout_s
        if epoch and peer.epoch != epoch:
            if since is not None and peer.epoch_since < since:
                return now - since <= self.timeout_s
            return False
        if peer.disconnected_at is not None and peer.disconnected_at >= peer.last_seen:
            return False
        return peer.healthy and now - peer.last_seen <= self.timeout_s

    def serving(self, role: str, now: float) -> list[str]:
        """Ids of live, healthy peers of ``role`` that take new work."""
        return [
            p.node_id
            for p in self.peers.values()
            if p.role == role and not p.draining and self.alive(p.node_id, now)
        ]

    def forget_old(self, now: float) -> None:
        """Drops peers silent for ten timeouts."""
        for node_id in [
            k for k, p in self.peers.items() if now - p.last_seen > 10 * self.timeout_s
        ]:
            del self.peers[node_id]
