"""UCX endpoints: to other workers (kept for good) and to our own worker (to cancel receives).

Two facts about UCX with error handling off shape this module:

* Closing an endpoint flushes it, and a flush can wait for the peer (measured: closing the
  endpoint to a stopped peer blocked the event loop until that peer resumed).
  UCX also pairs the endpoints between two workers, so closing ours breaks the peer's way back.
  Endpoints to other workers are therefore never closed while the process runs.
* The only way ucxx offers to cancel a posted receive is to close the endpoint it was posted
  through. A tag receive matches messages from any sender, so a pull posts its receives through
  an endpoint to its own worker (an "inbox"); closing that one talks to nobody else and returns
  at once, cancelling exactly that pull's receives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Connect = Callable[[bytes], Any]
"""Makes an endpoint, with error handling off, to the worker at the given address."""


class Endpoints:
    """Endpoints to other workers, one per worker address.

    Owns every endpoint it made. Invariant: an endpoint, once made, stays for the life of the
    process (see the module docstring for why closing one is worse than keeping it).
    """

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._eps: dict[bytes, Any] = {}

    def get(self, address: bytes) -> Any:
        ep = self._eps.get(address)
        if ep is None:
            ep = self._eps[address] = self._connect(address)
        return ep


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
        inbox.close_blocking(period=10**10, max_attempts=1)
