"""UCX endpoints to other workers, shared by the pulls in flight and replaced when they break.

UCX pairs an endpoint from worker A to worker B with one from B to A, and B's rendezvous sends
(every block) are acknowledged through A's half of the pair. Aborting an endpoint, the only way
to cancel the receives still posted on it, therefore breaks the peer's endpoint back to us as
well. Epochs repair that: a client bumps its epoch for a server whenever it aborts its endpoint,
every request carries the epoch, and a server that sees a newer epoch replaces its endpoint back
to that client instead of sending through the broken one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class StaleRequestError(Exception):
    """A request sent on an endpoint its client has since given up."""


@dataclass(eq=False, slots=True)
class Peer:
    """One endpoint and the pulls using it. Invariant: ``inflight`` never goes below zero."""

    ep: Any
    epoch: int
    inflight: int = 0
    retired: bool = False


class Endpoints:
    """Endpoints made from worker addresses (error handling off), one per address.

    Owns every endpoint it made. Invariant: a retired endpoint is out of the cache, so new pulls
    get a fresh one, and it is aborted at once or when its last pull releases it. With
    ``own_epochs`` (the client side) retiring an endpoint bumps that address's epoch; otherwise
    (the server side) the epoch of each endpoint is the one its client asked for.
    """

    def __init__(self, ucxx: Any, *, own_epochs: bool) -> None:
        self._ucxx = ucxx
        self._own_epochs = own_epochs
        self._peers: dict[bytes, Peer] = {}
        self._epochs: dict[bytes, int] = {}

    async def acquire(self, address: bytes, epoch: int | None = None) -> Peer:
        peer = self._peers.get(address)
        if peer is not None and epoch is not None and peer.epoch != epoch:
            if epoch < peer.epoch:
                raise StaleRequestError(f"epoch {epoch} is older than {peer.epoch}")
            self.retire(address, peer, now=True)  # its other half is gone: sends would hang
            peer = None
        if peer is None:
            ep = await self._ucxx.create_endpoint_from_worker_address(
                self._ucxx.get_ucx_address_from_buffer(address),
                endpoint_error_handling=False,
            )
            # Creation does not yield today, but keep the first endpoint if that ever changes.
            peer = self._peers.get(address)
            if peer is None:
                own = self._epochs.get(address, 0)
                peer = self._peers[address] = Peer(ep, own if epoch is None else epoch)
            else:
                ep.abort()
        peer.inflight += 1
        return peer

    def release(self, peer: Peer) -> None:
        peer.inflight -= 1
        if peer.retired and peer.inflight == 0:
            peer.ep.abort()

    def retire(self, address: bytes, peer: Peer, *, now: bool) -> None:
        """Stop handing ``peer`` out; abort it now, or once its last pull releases it."""
        if self._peers.get(address) is peer:
            del self._peers[address]
            if self._own_epochs:
                self._epochs[address] = peer.epoch + 1
        peer.retired = True
        if now or peer.inflight == 0:
            peer.ep.abort()

    def close(self) -> None:
        for address, peer in list(self._peers.items()):
            self.retire(address, peer, now=True)
