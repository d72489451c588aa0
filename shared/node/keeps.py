"""A node's pool following the catalogue's keep ledger: a keep that was dropped (by a request
that ran on another node, or undone) ends here too, and one extended elsewhere lasts longer.

The engine itself keeps a request's prompt blocks when its prefill completes and ends keeps on
their time (``shared.kv.keeps.PoolKeeps``); this only brings the pool in line with the ledger.
"""

from __future__ import annotations

import logging

from shared.kv.keep_watch import KEEP_SYNC_S, KeepLedgerReader, KeepWatch
from shared.node.engine_host import EngineHost

log = logging.getLogger(__name__)


class NodeKeeps:
    """Owns the node's watch of the ledger.

    The pool is changed as the engine's bookkeeping is: under the engine's lock, on a thread
    of its own (never the event loop's, which a step's planning could hold up), touching only
    kept blocks, which no running sequence writes.
    """

    def __init__(
        self, engine: EngineHost, reader: KeepLedgerReader, interval_s: float = KEEP_SYNC_S
    ) -> None:
        self.engine = engine
        self.watch = KeepWatch(reader, self._follow, interval_s)
        self.keeps_ended = 0

    @property
    def interval_s(self) -> float:
        return self.watch.interval_s

    async def tick(self) -> None:
        """Reads the ledger once and follows it if it moved."""
        await self.watch.poll()

    async def _follow(self, ledger: dict[bytes, float], asked_at: float) -> None:
        ended = await self.engine.follow_keeps(ledger, asked_at)
        if ended:
            log.info("%d kept blocks let go: their keeps ended", ended)
        self.keeps_ended += ended
