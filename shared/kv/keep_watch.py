"""Following the catalogue's keep ledger from a holder of blocks (a node's pool, tierd's tiers):
the keeps in force, read again whenever the ledger's version moves.

No framework here: the ledger is read through any object with the client's ``list_keeps``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from shared.errors import CrescentError
from shared.rpc.types import KeepListing

log = logging.getLogger(__name__)
#: How often a holder checks the ledger's version (a keep dropped or extended elsewhere
#: reaches the holder within this long; a holder's own keeps apply at once).
KEEP_SYNC_S = 1.0
#: What a holder is told of each new view: the keeps (hash -> unix time each ends,
#: ``math.inf``: pinned) and the time the ledger was asked (keeps made since may be missing).
OnKeeps = Callable[[dict[bytes, float], float], Awaitable[None]]


class KeepLedgerReader(Protocol):
    async def list_keeps(self, version: int = 0) -> KeepListing: ...


class KeepWatch:
    """Owns the holder's view of the ledger: its version and the keeps in force.

    Invariant: ``on_keeps`` is called once per version the holder learns, in order; while the
    ledger cannot be read the last view stands (a holder never drops a keep for want of an
    answer), and the outage is logged once.
    """

    def __init__(
        self, reader: KeepLedgerReader, on_keeps: OnKeeps, interval_s: float = KEEP_SYNC_S
    ) -> None:
        self.reader = reader
        self.on_keeps = on_keeps
        self.interval_s = interval_s
        self.version = 0
        self.keeps: dict[bytes, float] = {}
        self._outage = False

    async def poll(self) -> bool:
        """Reads the ledger once; True if the view changed. The holder's lifecycle runs it
        every ``interval_s``."""
        asked_at = time.time()
        try:
            listing = await self.reader.list_keeps(self.version)
        except CrescentError as exc:  # CacheMetaUnavailable, CacheMetaError
            if not self._outage:
                log.warning("cannot read the keep ledger (%s); the keeps known stand", exc)
            self._outage = True
            return False
        self._outage = False
        if not listing.changed:
            return False
        self.version, self.keeps = listing.version, listing.keeps
        await self.on_keeps(self.keeps, asked_at)
        return True
