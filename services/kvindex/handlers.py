"""The bus side of kvindex: frames of KV events in, resend requests out."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

import msgspec

from services.kvindex.index import KvIndex
from shared import subjects
from shared.bus import Bus
from shared.kv_events import KvEventFrame, KvResyncRequest, decode_batch

log = logging.getLogger(__name__)


class KvEventHandlers:
    """Translates each frame into a fold of the index, and a fold's resync into a request to
    the publisher. Owns the tallies of frames by outcome (``folded``, ``replayed``,
    ``malformed``, ``misaddressed``, ``refused``) and of the resend requests sent. Invariant:
    the index names each publisher by the role and id of the subject its frames came on
    (``subjects.kv_publisher``), so one role's frames never reach another role's views."""

    def __init__(
        self, index: KvIndex, bus: Bus, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.index = index
        self.bus = bus
        self.clock = clock
        self.frames: Counter[str] = Counter()
        self.resyncs_asked = 0

    async def on_frame(self, subject: str, frame: KvEventFrame) -> None:
        # The subject is what NATS permissions vouch for (a role's subjects, or one node's):
        # a frame naming another role or publisher would speak for someone else.
        if subject != subjects.kv_events(frame.role, frame.publisher):
            self.frames["misaddressed"] += 1
            log.warning(
                "dropped KV events of %s %r sent on %s", frame.role, frame.publisher, subject
            )
            return
        try:
            batch = decode_batch(frame.batch)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Its number is not folded: the next frame shows a gap, and a resend follows.
            self.frames["malformed"] += 1
            log.warning("dropped a malformed KV event batch on %s: %s", subject, exc)
            return
        name = subjects.kv_publisher(frame.role, frame.publisher)
        folded = self.index.fold(name, frame.epoch, frame.seq, batch, self.clock())
        if folded.refused:
            self.frames["refused"] += 1
            if self.frames["refused"] % 1000 == 1:  # a warning, not one per frame
                log.warning(
                    "KV events of %s refused: %d publishers indexed already",
                    name,
                    len(self.index.publishers),
                )
            return
        self.frames["folded" if folded.applied else "replayed"] += 1
        if folded.resync:
            await self.ask_resend(frame.role, frame.publisher, folded.resync)

    async def ask_resend(self, role: str, publisher: str, reason: str) -> None:
        log.info("asking %s %s to resend its KV events: %s", role, publisher, reason)
        self.resyncs_asked += 1
        request = KvResyncRequest(role=role, publisher=publisher, reason=reason)
        await self.bus.publish(subjects.kv_resyncs(role, publisher), request)
