"""Every request a node serves, in one table: where it stands, what it produced (for replays)
and what its role keeps of it until its next step. Pure bookkeeping, no I/O.

The stages a request passes, by role:

- prefill node: QUEUED → ADMITTED → (first token) → OFFERED → LEASED → DONE (handed over),
  or straight to DONE when the first token is also the last;
- decode node, a hand-off: QUEUED (waiting for room) → ADMITTED (blocks reserved, its KV
  pulled) → RUNNING → DONE;
- decode node, a prompt of its own: QUEUED → ADMITTED → (first token) → RUNNING → DONE.

Any active stage may end in DONE by an error, an abort or a migration.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from shared.cluster_messages import MAX_ARRIVED
from shared.messages import ReplayReply, TokenLogprob
from shared.node.decode_timer import DecodeTimer

if TYPE_CHECKING:
    from shared.cluster_messages import KVHandoff, PrefillTask
    from shared.node.prefix import FetchedPrefix

#: Finished requests are remembered this long (and at most this many), so a gateway that lost
#: their last chunks can still fetch them.
DONE_TTL_S = 60.0
MAX_DONE = 4096
#: Reasons that end a completion (others, such as an abort or a hand-over, end only this
#: node's part of it).
_FINISHES = ("stop", "length")


class Stage(Enum):
    QUEUED = "queued"  # accepted, waiting for room or for its pulls
    ADMITTED = "admitted"  # in the engine: its prompt computed here, or its KV pulled in
    OFFERED = "offered"  # prefill done, decode nodes are asked to take it
    LEASED = "leased"  # a decode node took it and pulls its KV
    RUNNING = "running"  # decoding here
    DONE = "done"  # finished, failed, aborted or handed over; kept for replays


class StageError(RuntimeError):
    """A transition asked of a request in a stage it cannot come from: a bug, never input."""


@dataclass(slots=True)
class NodeRequest:
    """One request on this node. ``token_ids`` are the tokens this node produced for it,
    starting at completion position ``output_offset``. ``task``/``handoff`` are what it came
    as; ``arrived`` (monotonic) and ``fetched`` time and describe its prompt until its first
    token. Only ``RequestTable`` changes ``stage``."""

    request_id: str
    gateway_id: str
    deadline_ts: float
    output_offset: int
    stream_key: bytes = b""  # tags its chunks and checks its aborts (``shared.stream_auth``)
    arrived: float = 0.0
    task: PrefillTask | None = None
    handoff: KVHandoff | None = None
    fetched: FetchedPrefix | None = None
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

    @property
    def next_index(self) -> int:
        return self.output_offset + len(self.token_ids)

    @property
    def active(self) -> bool:
        return self.stage is not Stage.DONE

    @property
    def before_first_token(self) -> bool:
        """Still waiting for its prompt's first token: not a hand-off (whose first token
        came with it), and queued or admitted with nothing produced yet."""
        early = self.stage in (Stage.QUEUED, Stage.ADMITTED)
        return self.handoff is None and early and not self.token_ids


class RequestTable:
    """Owns the node's requests, active and recently done.

    Invariants: a request id has at most one entry; ``stage`` changes only through the
    transition methods below, each of which checks the stage it comes from (a request already
    done is left alone and None returned: it was aborted meanwhile; any other wrong stage
    raises ``StageError``); a done request keeps its output until ``forget_done``.
    """

    def __init__(self) -> None:
        # Active requests apart from done ones: the roles scan the active ones on every task
        # and step, and up to ``MAX_DONE`` done ones wait here for replays.
        self._active: dict[str, NodeRequest] = {}
        self._done: OrderedDict[str, NodeRequest] = OrderedDict()
        #: Requests ended, by outcome (a finish reason, ``error``, ``abort``...), for metrics.
        self.outcomes: Counter[str] = Counter()
        # Ids accepted since ``take_accepted`` last ran: a decode node's heartbeat names them
        # so the scheduler stops counting them as on their way (the newest are kept).
        self._accepted: deque[str] = deque(maxlen=MAX_ARRIVED)

    # -- reading ------------------------------------------------------------------------

    def get(self, request_id: str) -> NodeRequest | None:
        return self._active.get(request_id) or self._done.get(request_id)

    def active(self, request_id: str) -> NodeRequest | None:
        return self._active.get(request_id)

    def __iter__(self) -> Iterator[NodeRequest]:
        """The active requests in arrival order (a copy: transitions may follow)."""
        return iter(list(self._active.values()))

    def count(self, *stages: Stage) -> int:
        done = len(self._done) if Stage.DONE in stages else 0
        return done + sum(1 for r in self._active.values() if r.stage in stages)

    def take_accepted(self) -> list[str]:
        """The ids accepted since the last call (at most ``MAX_ARRIVED``, the newest)."""
        taken = list(self._accepted)
        self._accepted.clear()
        return taken

    def active_ids(self) -> list[str]:
        return [r.request_id for r in self]

    def by_gateway(self) -> dict[str, list[str]]:
        """Active requests per gateway that sent them (requests without one are left out)."""
        grouped: dict[str, list[str]] = {}
        for request in self:
            if request.gateway_id:
                grouped.setdefault(request.gateway_id, []).append(request.request_id)
        return grouped

    def overdue(self, wall_now: float) -> list[str]:
        """Active requests whose client stopped waiting (their deadline passed)."""
        return [r.request_id for r in self if 0 < r.deadline_ts < wall_now]

    def replay(self, request_id: str, from_index: int) -> ReplayReply:
        request = self.get(request_id)
        if request is None:
            return ReplayReply(known=False)
        start = max(from_index, request.output_offset)
        skip = start - request.output_offset
        return ReplayReply(
            known=True,
            running=request.active,
            index=start,
            token_ids=request.token_ids[skip:],
            logprobs=request.logprobs[skip:] if request.logprobs else None,
            finish_reason=request.finish_reason if request.finish_reason in _FINISHES else None,
            num_cached_tokens=request.num_cached_tokens,
            cached_by_tier=request.cached_by_tier,
            error=request.error,
            error_code=request.error_code,
            owner=request.owner,
            owner_epoch=request.owner_epoch,
        )

    # -- transitions --------------------------------------------------------------------

    def accept(self, request: NodeRequest) -> NodeRequest:
        """Records a new request in QUEUED; a done one with the same id is replaced."""
        current = self._active.get(request.request_id)
        if current is not None:
            raise StageError(f"{request.request_id} is already {current.stage.value}")
        request.stage = Stage.QUEUED
        self._done.pop(request.request_id, None)
        self._active[request.request_id] = request
        self._accepted.append(request.request_id)
        return request

    def admitted(self, request_id: str) -> NodeRequest | None:
        """The engine took it: its prompt is computed here, or its blocks are reserved."""
        return self._move(request_id, (Stage.QUEUED,), Stage.ADMITTED)

    def first_token(
        self,
        request_id: str,
        token_ids: list[int],
        logprobs: list[TokenLogprob] | None,
        num_cached_tokens: int,
        cached_by_tier: dict[str, int],
    ) -> NodeRequest | None:
        """Records the first output and what of the prompt came from cache; the stage stays
        (a prefill node offers it next, a decode node runs it)."""
        request = self._check(request_id, (Stage.ADMITTED, Stage.QUEUED))
        if request is not None:
            request.num_cached_tokens = num_cached_tokens
            request.cached_by_tier = dict(cached_by_tier)
            self._extend(request, token_ids, logprobs)
        return request

    def offered(self, request_id: str) -> NodeRequest | None:
        """Its KV is leased for a pull and offered to decode nodes."""
        return self._move(request_id, (Stage.ADMITTED,), Stage.OFFERED)

    def leased(self, request_id: str, owner: str, owner_epoch: str) -> NodeRequest | None:
        """A decode node took it; it now owns the request's stream."""
        request = self._move(request_id, (Stage.OFFERED,), Stage.LEASED)
        if request is not None:
            request.owner, request.owner_epoch = owner, owner_epoch
        return request

    def running(self, request_id: str) -> NodeRequest | None:
        """It decodes here: its KV arrived, or its first token was computed here."""
        return self._move(request_id, (Stage.ADMITTED, Stage.RUNNING), Stage.RUNNING)

    def produced(
        self, request_id: str, token_ids: list[int], logprobs: list[TokenLogprob] | None
    ) -> NodeRequest | None:
        """Records tokens decoded here."""
        request = self._check(request_id, (Stage.RUNNING,))
        if request is not None:
            self._extend(request, token_ids, logprobs)
        return request

    def finished(self, request_id: str, now: float, reason: str) -> NodeRequest | None:
        """Ends it for ``reason`` (a finish, an abort, a hand-over, a migration)."""
        return self._end(request_id, now, reason, None, None)

    def failed(self, request_id: str, now: float, error: str, code: int) -> NodeRequest | None:
        """Ends it with an error its client sees."""
        return self._end(request_id, now, None, error, code)

    def forget_done(self, now: float) -> None:
        """Drops finished requests past their replay window, oldest first."""
        excess = len(self._done) - MAX_DONE
        for request in list(self._done.values()):  # oldest first
            if excess <= 0 and now - request.done_at <= DONE_TTL_S:
                break
            del self._done[request.request_id]
            excess -= 1

    # -- helpers ------------------------------------------------------------------------

    def _check(self, request_id: str, sources: tuple[Stage, ...]) -> NodeRequest | None:
        request = self._active.get(request_id)
        if request is None:
            return None
        if request.stage not in sources:
            names = "/".join(s.value for s in sources)
            raise StageError(f"{request_id} is {request.stage.value}, not {names}")
        return request

    def _move(
        self, request_id: str, sources: tuple[Stage, ...], target: Stage
    ) -> NodeRequest | None:
        request = self._check(request_id, sources)
        if request is not None:
            request.stage = target
        return request

    @staticmethod
    def _extend(
        request: NodeRequest, token_ids: list[int], logprobs: list[TokenLogprob] | None
    ) -> None:
        request.token_ids.extend(token_ids)
        request.logprobs.extend(logprobs or ())

    def _end(
        self,
        request_id: str,
        now: float,
        reason: str | None,
        error: str | None,
        code: int | None,
    ) -> NodeRequest | None:
        request = self._active.pop(request_id, None)
        if request is None:
            return None
        request.stage = Stage.DONE
        self.outcomes["error" if error is not None else reason or "stop"] += 1
        request.finish_reason, request.error, request.error_code = reason, error, code
        request.done_at = now
        self._done[request_id] = request
        return request
