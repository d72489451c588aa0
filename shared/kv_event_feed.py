"""The publishing side of KV events (``shared.kv_events``): one publisher's numbered stream.

A catalogue session hands its feed what it has just told cachemeta: blocks stored, blocks
dropped, or a tier's whole content (which goes out as that tier cleared, then stored again).
How a publisher resyncs its listeners: its first round after start, after an outage of
cachemeta and after a listener's ``KvResyncRequest`` is such a whole resend, so a listener that
lost frames, or joined late, has every tier back once that resend has arrived.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from shared import subjects
from shared.bus import Bus
from shared.kv_events import (
    MAX_FRAME_BLOCKS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    KvEventFrame,
    KvResyncRequest,
    encode_batch,
    medium_of,
)

log = logging.getLogger(__name__)
#: The longest run one BlockStored event carries (so any one fits in a frame).
MAX_RUN_BLOCKS = MAX_FRAME_BLOCKS // 2


@dataclass(frozen=True, slots=True)
class ChainBlock:
    """A stored block as an event names it: its hash, its parent's, its tokens."""

    block_hash: bytes
    parent_hash: bytes
    num_tokens: int


class KvEventFeed:
    """Owns the event stream of one publisher, ``publisher`` of ``role`` (prefill, decode or
    tierd): its epoch, the next frame number, and whether a whole resend is owed to its
    listeners.

    Invariants: frames leave numbered 0, 1, 2, ... within the epoch; a frame that could not be
    sent still uses its number, so listeners see the hole, and a resend is owed
    (``take_resend``) from then on, as it is after a listener asks for one. Sending never
    raises: the catalogue session it rides on must not fail over a listener.
    """

    def __init__(self, bus: Bus, role: str, publisher: str, epoch: str = "") -> None:
        if role not in subjects.KV_EVENT_ROLES:
            raise ValueError(f"{role!r} publishes no KV events")
        self.bus = bus
        self.role = role
        self.publisher = subjects.check_token(publisher, "publisher id")
        self.epoch = epoch or uuid.uuid4().hex[:16]
        self.subject = subjects.kv_events(role, publisher)
        self.next_seq = 0
        self._resend = False
        self._listening = False
        self._failing = False
        # One send at a time: the frames of one change go out together and in number order,
        # whichever task (a sink round, a prefetch) made it.
        self._sending = asyncio.Lock()

    def take_resend(self) -> bool:
        """True once per resend owed; the caller then sends each tier whole (``replaced``)."""
        owed, self._resend = self._resend, False
        return owed

    async def stored(self, tier: str, blocks: Sequence[ChainBlock]) -> None:
        await self._send(list(stored_events(tier, blocks)))

    async def removed(self, tier: str, block_hashes: Sequence[bytes]) -> None:
        medium, step = medium_of(tier), MAX_FRAME_BLOCKS
        events: list[Event] = [
            BlockRemoved(list(block_hashes[i : i + step]), medium)
            for i in range(0, len(block_hashes), step)
        ]
        await self._send(events)

    async def replaced(self, tier: str, blocks: Sequence[ChainBlock]) -> None:
        """``tier`` now holds exactly ``blocks``: cleared, then stored again."""
        await self._send([AllBlocksCleared(medium_of(tier)), *stored_events(tier, blocks)])

    async def _send(self, events: list[Event]) -> None:
        if not events:
            return
        async with self._sending:
            await self._listen()
            for batch in frames(events):
                await self._send_frame(batch)

    async def _send_frame(self, batch: list[Event]) -> None:
        frame = KvEventFrame(
            role=self.role,
            publisher=self.publisher,
            epoch=self.epoch,
            seq=self.next_seq,
            batch=encode_batch(batch),
        )
        self.next_seq += 1
        try:
            await self.bus.publish(self.subject, frame)
        except Exception as exc:
            self._resend = True
            if not self._failing:
                log.warning("KV events on %s not sent (%r); resend owed", self.subject, exc)
            self._failing = True
            return
        self._failing = False

    async def _listen(self) -> None:
        """Listens for resend requests from the first frame on (tried again until it works)."""
        if self._listening:
            return
        try:
            await self.bus.subscribe(
                subjects.kv_resyncs(self.role, self.publisher), KvResyncRequest, self._on_resync
            )
        except Exception as exc:
            log.debug("cannot listen for KV resync requests yet: %r", exc)
            return
        self._listening = True

    async def _on_resync(self, request: KvResyncRequest) -> None:
        if (request.role, request.publisher) != (self.role, self.publisher):
            return
        log.info("a listener asked %s for a KV resend: %s", self.publisher, request.reason)
        self._resend = True


def stored_events(tier: str, blocks: Iterable[ChainBlock]) -> Iterator[BlockStored]:
    """``blocks`` as BlockStored events, one per run in which each block is the parent of the
    next (vLLM's shape: the run's hashes and the first one's parent)."""
    medium = medium_of(tier)
    run: list[ChainBlock] = []
    for block in blocks:
        joins = bool(run) and block.parent_hash == run[-1].block_hash
        joins = joins and block.num_tokens == run[0].num_tokens and len(run) < MAX_RUN_BLOCKS
        if run and not joins:
            yield _stored(run, medium)
            run = []
        run.append(block)
    if run:
        yield _stored(run, medium)


def _stored(run: list[ChainBlock], medium: str) -> BlockStored:
    hashes: list[bytes | int] = [b.block_hash for b in run]
    return BlockStored(hashes, run[0].parent_hash, [], run[0].num_tokens, None, medium)


def frames(events: list[Event]) -> Iterator[list[Event]]:
    """``events`` in order, cut into batches of at most ``MAX_FRAME_BLOCKS`` blocks."""
    batch: list[Event] = []
    size = 0
    for event in events:
        count = 1 if isinstance(event, AllBlocksCleared) else len(event.block_hashes)
        if batch and size + count > MAX_FRAME_BLOCKS:
            yield batch
            batch, size = [], 0
        batch.append(event)
        size += count
    if batch:
        yield batch
