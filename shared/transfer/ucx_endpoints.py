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

from typing import Any


class Endpoints:
    """Endpoints to other workers, one per worker address, made with error handling off.

    Owns every endpoint it made. Invariant: an endpoint, once made, stays for the life of the
    process (see the module docstring for why closing one is worse than keeping it).
    """

    def __init__(self, ucxx: Any) -> None:
        self._ucxx = ucxx
        self._eps: dict[bytes, Any] = {}

    async def get(self, address: bytes) -> Any:
        ep = self._eps.get(address)
        if ep is None:
            ep = await self._ucxx.create_endpoint_from_worker_address(
                self._ucxx.get_ucx_address_from_buffer(address),
                endpoint_error_handling=False,
            )
            # Creation does not yield today; should it ever, keep the first endpoint made.
            ep = self._eps.setdefault(address, ep)
        return ep


class Inboxes:
    """Endpoints to this process's own worker that pulls post their receives through.

    Owns the idle inboxes. Invariant: an idle inbox has nothing posted on it; a pull that fails
    closes its inbox instead of returning it, which cancels whatever it still had posted.
    """

    def __init__(self, ucxx: Any, own_address: bytes) -> None:
        self._ucxx = ucxx
        self._own_address = own_address
        self._idle: list[Any] = []

    async def take(self) -> Any:
        if self._idle:
            return self._idle.pop()
        return await self._ucxx.create_endpoint_from_worker_address(
            self._ucxx.get_ucx_address_from_buffer(self._own_address),
            endpoint_error_handling=False,
        )

    def give_back(self, inbox: Any) -> None:
        self._idle.append(inbox)

    def cancel(self, inbox: Any) -> None:
        inbox.abort()
