"""The prefill→decode hand-off, decided: pure functions that say what happens next, as
effects a driver (``handoff_driver.py``) runs. No I/O here.

Prefill side: a finished prompt's KV is leased and offered to the ranked decode nodes in turn;
the first that accepts owns the request; a node that refuses is passed over, one that does not
answer may have taken it and is told to stop, and when none is left the request fails.

Decode side: accepted hand-offs wait in arrival order for room; each reserved one is pulled,
its lease released whatever came of the pull, and then it runs (or, if the pull failed, its
prompt is recomputed: slower, never wrong).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from shared.engine.types import ImportSlot

#: What a request's client sees when no decode node takes it.
NO_DECODE_NODE = "no decode node could take the request"


class Reply(Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused"  # busy or draining: try the next one
    FAILED = "failed"  # refused with an error code: the request can never run there
    GONE = "gone"  # nobody serves the node's subject
    SILENT = "silent"  # no answer in time: it may have taken the request


@dataclass(frozen=True, slots=True)
class OfferAnswer:
    node: str
    reply: Reply
    reason: str = ""
    code: int | None = None
    epoch: str = ""


@dataclass(frozen=True, slots=True)
class Offer:
    node: str


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Tell ``node`` alone to drop the request, in case it took it and only its answer was
    lost: the request must never run twice."""

    node: str


@dataclass(frozen=True, slots=True)
class Owned:
    node: str
    epoch: str


@dataclass(frozen=True, slots=True)
class GiveUp:
    message: str
    code: int


@dataclass(frozen=True, slots=True)
class Stop:
    """The request ended meanwhile (aborted): nothing more to do."""


OfferEffect = Offer | Withdraw | Owned | GiveUp | Stop


def next_offer(
    remaining: tuple[str, ...], answer: OfferAnswer | None, active: bool
) -> tuple[list[OfferEffect], tuple[str, ...]]:
    """What to do after ``answer`` (None: nothing asked yet) with ``remaining`` decode nodes
    not yet asked, in rank order; returns the effects, the last of which ends the round
    unless it is an ``Offer``, and the nodes still left after them."""
    effects: list[OfferEffect] = []
    if answer is not None:
        if answer.reply is Reply.ACCEPTED:
            return [Owned(answer.node, answer.epoch)], remaining
        if answer.reply is Reply.FAILED:
            return [GiveUp(answer.reason, answer.code or 500)], remaining
        if answer.reply is Reply.SILENT:
            effects.append(Withdraw(answer.node))
    if not active:
        return [*effects, Stop()], remaining
    if not remaining:
        return [*effects, GiveUp(NO_DECODE_NODE, 503)], remaining
    return [*effects, Offer(remaining[0])], remaining[1:]


class Reserved(Enum):
    NO_ROOM = "no_room"  # the pool is full: stop admitting until a sequence ends
    REFUSED = "refused"  # the engine can never run it: release its lease and fail it
    RESERVED = "reserved"  # blocks reserved: pull its KV


def after_reserve(slot: ImportSlot | None, refused: bool) -> Reserved:
    if refused:
        return Reserved.REFUSED
    return Reserved.NO_ROOM if slot is None else Reserved.RESERVED


@dataclass(frozen=True, slots=True)
class PullSpan:
    """Which of the prefill node's blocks fill the reserved ones (the slot skips blocks this
    node caches already); ``matches`` is False when the hand-off does not fit its prompt."""

    source_ids: list[int]
    checksums: list[int]
    matches: bool


def pull_span(block_ids: list[int], checksums: list[int], slot: ImportSlot) -> PullSpan:
    source_ids = block_ids[slot.first_block :]
    sums = checksums[slot.first_block :]
    matches = len(source_ids) == len(slot.block_ids) and len(sums) == len(source_ids)
    return PullSpan(source_ids, sums, matches)


class AfterPull(Enum):
    ABORT = "abort"  # the request ended while its KV came: drop it from the engine
    RUN = "run"  # its KV is in: decode
    RECOMPUTE = "recompute"  # the pull failed: compute its prompt here


def after_pull(active: bool, pulled_all: bool) -> AfterPull:
    """The lease is released in every case (the prefill node's blocks are no longer
    needed, whatever came of the pull); then this."""
    if not active:
        return AfterPull.ABORT
    return AfterPull.RUN if pulled_all else AfterPull.RECOMPUTE
