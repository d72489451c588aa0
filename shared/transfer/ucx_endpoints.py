"""UCX endpoints: to other workers (kept while they work) and to our own worker (to cancel
receives).

Three facts about UCX shape this module:

* Closing a working endpoint flushes it, and a flush can wait for the peer (measured: closing
  the endpoint to a stopped peer blocked the event loop until that peer resumed).
  UCX also pairs the endpoints between two workers, so closing ours breaks the peer's way back.
  Working endpoints to other workers are therefore never closed while the process runs.
* With error handling on (``ucx_settings``), UCX fails an endpoint whose peer died or reset the
  connection: everything in flight on it fails, and so would everything posted later. Such an
  endpoint is closed, which then returns at once, and forgotten. For ``FAILED_HOLD_S`` after,
  the address is refused at once: a new endpoint to a dead peer's shared memory would only
  fail on the next keepalive round, logging UCX errors meanwhile. After that, a new endpoint
  is tried, for a peer that lost its connection but not its life. With error handling off an
  endpoint never fails, so none is ever dropped.
* The only way ucxx offers to cancel a posted receive is to close the endpoint it was posted
  through. A tag receive matches messages from any sender, so a pull posts its receives through
  an endpoint to its own worker (an "inbox"); closing that one talks to nobody else and returns
  at once, cancelling exactly that pull's receives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Connect = Callable[[bytes], Any]
"""Makes an endpoint to the worker at the given address."""

FAILED_HOLD_S = 10.0
# Failed addresses remembered at most (each is a process that died or lost its connection).
MAX_FAILED = 1024


class PeerGoneError(ConnectionError):
    """UCX failed the endpoint to this address a moment ago: its peer died or reset."""


class Endpoints:
    """Endpoints to other workers, one per worker address, and the addresses that just failed.

    Owns every endpoint it made. Invariant: an endpoint stays cached for the life of the
    process unless UCX has failed it; a failed one is closed and forgotten by the next ``get``
    or ``drop_failed``, never handed out again, and its address refused for ``FAILED_HOLD_S``.
    """

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._eps: dict[bytes, Any] = {}
        self._failed: dict[bytes, float] = {}  # address -> when, oldest first

    def __contains__(self, address: object) -> bool:
        return address in self._eps

    def get(self, address: bytes) -> Any:
        ep = self._eps.get(address)
        if ep is not None and ep.alive:
            return ep
        # A new peer, or one whose endpoint failed: a good moment to let go of every failed
        # endpoint, such as those to clients that died while idle, which nobody asks for again.
        self.drop_failed()
        if self.failed(address):
            raise PeerGoneError("UCX failed the endpoint to this peer moments ago")
        ep = self._eps[address] = self._connect(address)
        return ep

    def drop_failed(self) -> int:
        """Close and forget every endpoint UCX has failed; returns how many."""
        failed = [address for address, ep in self._eps.items() if not ep.alive]
        now = time.monotonic()
        for address in failed:
            _close(self._eps.pop(address))
            self._failed.pop(address, None)  # re-inserted last: the dict stays oldest first
            self._failed[address] = now
        self._forget_old(now)
        return len(failed)

    def _forget_old(self, now: float) -> None:
        failed = self._failed
        while failed:
            oldest = next(iter(failed))
            if len(failed) <= MAX_FAILED and now - failed[oldest] <= FAILED_HOLD_S:
                return
            del failed[oldest]

    def failed(self, address: bytes) -> bool:
        """Whether UCX failed the endpoint to ``address`` within ``FAILED_HOLD_S``."""
        ep = self._eps.get(address)
        if ep is not None and not ep.alive:
            return True
        at = self._failed.get(address)
        return at is not None and time.monotonic() - at <= FAILED_HOLD_S


class Inboxes:
    """Endpoints to this process's own worker that pulls post their receives through.

    Owns the idle inboxes. Invariant: an idle inbox has nothing posted on it; a pull that fails
    closes its inbox instead of returning it, which cancels whatever it still had posted.
    """

    def __init__(self, connect: Connect, own_address: bytes) -> None:
        self._connect = connect
        self._own_address = own_address
        self._idle: list[Any] = []

    def take(self) -> Any:
        if self._idle:
            return self._idle.pop()
        return self._connect(self._own_address)

    def give_back(self, inbox: Any) -> None:
        self._idle.append(inbox)

    def cancel(self, inbox: Any) -> None:
        _close(inbox)


def _close(ep: Any) -> None:
    # The period only bounds a wait for ucxx's progress thread, where one runs; no close here
    # waits on a peer (module docstring), so it is never reached.
    ep.close_blocking(period=10**10, max_attempts=1)
