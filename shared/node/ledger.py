"""What a node holds for whom: the requests it serves (and their output, for replays), the
leases on blocks waiting for a pull, and who asked for each. Pure bookkeeping, no I/O."""

from __future__ import annotations

import secrets
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from enum import Enum

from shared.messages import ReplayReply, TokenLogprob
from shared.node.decode_timer import DecodeTimer

#: Finished requests are remembered this long (and at most this many), so a gateway that lost
#: their last chunks can still fetch them.
DONE_TTL_S = 60.0
MAX_DONE = 4096
#: Reasons that end a completion (others, such as an abort or a hand-over, end only this
#: node's part of it).
_FINISHES = ("stop", "length")


class Stage(Enum):
    QUEUED = "queued"  # accepted, waiting for room or for its pulls
    RUNNING = "running"  # in the engine
    HANDING_OFF = "handing_off"  # prefill done, a decode node is being asked to take it
    LEASED = "leased"  # a decode node took it and will pull its KV
    DONE = "done"  # finished, failed, aborted or handed over; kept for replays


@dataclass(slots=True)
class Holding:
    """One request on this node. ``token_ids`` are the tokens this node produced for it,
    starting at completion position ``output_offset``."""

    request_id: str
    gateway_id: str
    deadline_ts: float
    output_offset: int
    stage: Stage = Stage.QUEUED
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    error_code: int | None = None
    num_cached_tokens: int = 0
    cached_by_tier: dict[str, int] = field(default_factory=dict)
    owner: str = ""  # the node this one handed the request to
    owner_epoch: str = ""
    done_at: float = 0.0
    timer: DecodeTimer | None = None  # a decode node's times of it
    stream_key: bytes = b""  # tags its chunks and checks its aborts (``shared.stream_auth``)

    @property
    def next_index(self) -> int:
        return self.output_offset + len(self.token_ids)

    @property
    def active(self) -> bool:
        return self.stage is not Stage.DONE


@dataclass(slots=True)
class Lease:
    """Blocks held for a pull: a finished prefill's KV for its decode node (``request_id``
    set), or cached blocks pinned for a peer. ``token`` is the only credential a puller has."""

    token: str
    request_id: str
    block_ids: list[int]
    expires_at: float

    @property
    def pinned(self) -> bool:
        return not self.request_id


class Ledger:
    """Owns the node's holdings and leases.

    Invariants: a request id has at most one holding; a lease is returned by ``release``,
    ``release_all`` or ``expire`` at most once, so its blocks are freed exactly once; a lease
    serves only the blocks it was granted, and only until it expires.
    """

    def __init__(self, lease_ttl_s: float) -> None:
        self.lease_ttl_s = lease_ttl_s
        self._holdings: OrderedDict[str, Holding] = OrderedDict()
        self._leases: dict[str, Lease] = {}
        #: Requests ended, by outcome (a finish reason, ``error``, ``abort``...), for metrics.
        self.outcomes: Counter[str] = Counter()

    # -- requests -----------------------------------------------------------------------

    def open(
        self,
        request_id: str,
        gateway_id: str,
        deadline_ts: float,
        offset: int,
        stream_key: bytes = b"",
    ) -> Holding:
        """Records a new request; a finished one with the same id is replaced."""
        holding = Holding(request_id, gateway_id, deadline_ts, offset, stream_key=stream_key)
        self._holdings.pop(request_id, None)
        self._holdings[request_id] = holding
        return holding

    def get(self, request_id: str) -> Holding | None:
        return self._holdings.get(request_id)

    def active(self, request_id: str) -> Holding | None:
        holding = self._holdings.get(request_id)
        return holding if holding is not None and holding.active else None

    def count(self, *stages: Stage) -> int:
        return sum(1 for h in self._holdings.values() if h.stage in stages)

    def active_ids(self) -> list[str]:
        return [h.request_id for h in self._holdings.values() if h.active]

    def record(
        self, request_id: str, token_ids: list[int], logprobs: list[TokenLogprob] | None
    ) -> None:
        holding = self._holdings.get(request_id)
        if holding is not None and holding.active:
            holding.token_ids.extend(token_ids)
            holding.logprobs.extend(logprobs or ())

    def finish(
        self,
        request_id: str,
        now: float,
        *,
        reason: str | None = None,
        error: str | None = None,
        error_code: int | None = None,
    ) -> Holding | None:
        """Marks the request done; returns its holding if it was active."""
        holding = self._holdings.get(request_id)
        if holding is None or not holding.active:
            return None
        holding.stage = Stage.DONE
        self.outcomes["error" if error is not None else reason or "stop"] += 1
        holding.finish_reason = reason
        holding.error = error
        holding.error_code = error_code
        holding.done_at = now
        self._holdings.move_to_end(request_id)
        return holding

    def forget_done(self, now: float) -> None:
        """Drops finished requests past their replay window, oldest first."""
        done = [h for h in self._holdings.values() if not h.active]
        excess = len(done) - MAX_DONE
        for holding in done:
            if excess > 0 or now - holding.done_at > DONE_TTL_S:
                del self._holdings[holding.request_id]
                excess -= 1

    def by_gateway(self) -> dict[str, list[str]]:
        """Active requests per gateway that sent them (requests without one are left out)."""
        grouped: dict[str, list[str]] = {}
        for holding in self._holdings.values():
            if holding.active and holding.gateway_id:
                grouped.setdefault(holding.gateway_id, []).append(holding.request_id)
        return grouped

    def overdue(self, wall_now: float) -> list[str]:
        """Active requests whose client stopped waiting (their deadline passed)."""
        return [
            h.request_id
            for h in self._holdings.values()
            if h.active and 0 < h.deadline_ts < wall_now
        ]

    def replay(self, request_id: str, from_index: int) -> ReplayReply:
        holding = self._holdings.get(request_id)
        if holding is None:
            return ReplayReply(known=False)
        start = max(from_index, holding.output_offset)
        skip = start - holding.output_offset
        logprobs = holding.logprobs[skip:] if holding.logprobs else None
        return ReplayReply(
            known=True,
            running=holding.active,
            index=start,
            token_ids=holding.token_ids[skip:],
            logprobs=logprobs,
            finish_reason=holding.finish_reason if holding.finish_reason in _FINISHES else None,
            num_cached_tokens=holding.num_cached_tokens,
            cached_by_tier=holding.cached_by_tier,
            error=holding.error,
            error_code=holding.error_code,
            owner=holding.owner,
            owner_epoch=holding.owner_epoch,
        )

    # -- leases -------------------------------------------------------------------------

    def grant(self, request_id: str, block_ids: list[int], now: float) -> Lease:
        """A lease on ``block_ids`` under a fresh random token (``request_id`` empty: a pin)."""
        lease = Lease(
            secrets.token_urlsafe(24), request_id, list(block_ids), now + self.lease_ttl_s
        )
        self._leases[lease.token] = lease
        return lease

    def release(self, token: str) -> Lease | None:
        return self._leases.pop(token, None)

    def release_all(self, request_id: str) -> list[Lease]:
        """Every lease held for ``request_id`` (an abort ends them all)."""
        gone = [lease for lease in self._leases.values() if lease.request_id == request_id]
        for lease in gone:
            del self._leases[lease.token]
        return gone

    def expire(self, now: float) -> list[Lease]:
        gone = [lease for lease in self._leases.values() if lease.expires_at < now]
        for lease in gone:
            del self._leases[lease.token]
        return gone

    def blocks_for(self, token: str, block_ids: list[int], now: float) -> list[int] | None:
        """The requested blocks if the lease is live and holds every one of them."""
        lease = self._leases.get(token)
        if lease is None or lease.expires_at < now:
            return None
        held = set(lease.block_ids)
        return block_ids if all(b in held for b in block_ids) else None

    @property
    def num_leases(self) -> int:
        return len(self._leases)

    @property
    def num_pins(self) -> int:
        return sum(1 for lease in self._leases.values() if lease.pinned)
