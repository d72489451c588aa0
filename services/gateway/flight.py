"""The attempts behind one API request's choices: submitting each to a scheduler, resuming it
elsewhere from a position, asking its node to replay, and aborting what is left at the end.

Every outcome (a chunk, a replay's answer, a resumed attempt's acceptance) arrives as one
event on the flight's queue, so the run that owns the flight changes its state in one place.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from services.gateway import errors
from services.gateway.dispatch import Dispatcher, SubmitTimeout
from services.gateway.errors import ApiError
from services.gateway.recovery import ChoiceWatch
from shared.background import Background
from shared.bus import Subscription
from shared.messages import GenerateRequest, ReplayReply, SubmitReply, TokenChunk

log = logging.getLogger(__name__)
#: A scheduler that took a request and went silent is tried again this often, each time
#: under a new request id (the old one is aborted, in case it was placed after all).
MAX_SUBMIT_TRIES = 3
#: How often a resumed attempt that no node could take is submitted again.
RESUME_RETRY_S = 0.5


@dataclass(slots=True)
class Arrived:
    choice: int
    request_id: str
    chunk: TokenChunk


@dataclass(slots=True)
class Replayed:
    choice: int
    request_id: str
    reply: ReplayReply | None


@dataclass(slots=True)
class Moved:
    choice: int
    request_id: str
    reply: SubmitReply | None = None
    error: ApiError | None = None


Event = Arrived | Replayed | Moved


@dataclass(slots=True)
class ChoiceStream:
    """One choice: its first request, and the attempt that serves it now."""

    index: int
    base: GenerateRequest
    request_id: str = ""
    attempt: int = 0
    offset: int = 0  # completion position the current attempt starts from
    subscription: Subscription | None = None
    watch: ChoiceWatch | None = None
    ended: bool = False  # the choice finished or failed; nothing to abort
    busy: bool = False  # a resume is under way, until the run takes its Moved event
    refused: bool = False  # the scheduler refused the current attempt


@dataclass(slots=True)
class Flight:
    """Owns the attempts of one API request and the queue their events arrive on.

    Invariant: an attempt is subscribed to before it is submitted, and registered with the
    dispatcher from then until it is superseded or the flight closes; ``close`` aborts every
    attempt whose choice has not ended, exactly once.
    """

    dispatcher: Dispatcher
    streams: list[ChoiceStream]
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    reconnected_at: float | None = None  # when the bus came back, until the run probes
    closed: bool = False
    resume_wait_s: float = 30.0
    _work: Background = field(default_factory=Background)

    @classmethod
    def of(cls, dispatcher: Dispatcher, requests: Sequence[GenerateRequest]) -> Flight:
        streams = [
            ChoiceStream(i, r, r.request_id, offset=r.sampling.output_offset)
            for i, r in enumerate(requests)
        ]
        return cls(dispatcher, streams)

    def bus_reconnected(self) -> None:
        self.reconnected_at = self.dispatcher.clock()

    async def start(self) -> list[SubmitReply]:
        """Submits every choice; raises the ``ApiError`` of the first refused one (the others
        are then aborted by ``close``, which the caller must call either way)."""
        replies = await asyncio.gather(
            *(self._submit(s, s.base) for s in self.streams), return_exceptions=True
        )
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return [r for r in replies if isinstance(r, SubmitReply)]

    async def _submit(self, stream: ChoiceStream, request: GenerateRequest) -> SubmitReply:
        for _ in range(MAX_SUBMIT_TRIES):
            await self._attach(stream, request.request_id)
            try:
                reply = await self.dispatcher.submit(request)
            except SubmitTimeout as exc:
                log.warning(
                    "no scheduler answered for %s (%s); trying again", stream.base.request_id, exc
                )
                request = self._next_attempt(stream, request)
                continue
            if not reply.accepted:
                stream.refused = True  # nothing runs under this id: nothing to abort
                raise errors.from_backend(
                    reply.error_code, reply.error, reply.retry_after_s, reply.error_kind
                )
            return reply
        raise errors.unavailable("No scheduler answered the request in time.")

    async def _attach(self, stream: ChoiceStream, request_id: str) -> None:
        """Makes ``request_id`` the stream's attempt: subscribed and registered."""
        old = stream.subscription
        if old is not None and stream.request_id != request_id:
            if stream.refused:
                self.dispatcher.in_flight.pop(stream.request_id, None)
                self.dispatcher.abort_soon([], [old])
            else:
                self._let_go(stream.request_id, [old])
        stream.request_id = request_id
        stream.refused = False
        handler = functools.partial(self._on_chunk, stream.index, request_id)
        stream.subscription = await self.dispatcher.subscribe_tokens(
            request_id, handler, stream.base.stream_key
        )
        self.dispatcher.in_flight[request_id] = self

    def _next_attempt(self, stream: ChoiceStream, request: GenerateRequest) -> GenerateRequest:
        stream.attempt += 1
        return msgspec.structs.replace(
            request, request_id=f"{stream.base.request_id}-r{stream.attempt}"
        )

    async def _on_chunk(self, choice: int, request_id: str, chunk: TokenChunk) -> None:
        # The subject names the attempt; a chunk claiming another id must not be misrouted.
        chunk.request_id = request_id
        self.queue.put_nowait(Arrived(choice, request_id, chunk))

    def resume(self, stream: ChoiceStream, tokens: list[int]) -> None:
        """Starts the next attempt from completion position ``len(tokens)``, in the
        background; its outcome arrives as a ``Moved`` event."""
        base = stream.base
        done = len(tokens)
        sampling = msgspec.structs.replace(
            base.sampling,
            max_tokens=base.sampling.max_tokens - done,
            output_offset=base.sampling.output_offset + done,
        )
        request = msgspec.structs.replace(
            base,
            prompt_token_ids=[*base.prompt_token_ids, *tokens],
            sampling=sampling,
            resume=True,
        )
        stream.busy = True
        stream.offset = sampling.output_offset
        if stream.watch is not None:
            stream.watch.restart(self.dispatcher.clock())
        self._work.spawn(self._resume(stream, self._next_attempt(stream, request)))

    async def _resume(self, stream: ChoiceStream, request: GenerateRequest) -> None:
        """Submits the resumed attempt; while no node can take it (they restart, say), it is
        tried again for up to ``resume_wait_s``: its client is waiting, not refused."""
        give_up = self.dispatcher.clock() + self.resume_wait_s
        while True:
            try:
                reply = await self._submit(stream, request)
                self.queue.put_nowait(Moved(stream.index, stream.request_id, reply=reply))
                return
            except ApiError as exc:
                if exc.status != 503 or self.dispatcher.clock() >= give_up:
                    self.queue.put_nowait(Moved(stream.index, stream.request_id, error=exc))
                    return
            await asyncio.sleep(RESUME_RETRY_S)
            request = self._next_attempt(stream, request)

    def replay(self, stream: ChoiceStream, owner: str, from_index: int) -> None:
        """Asks ``owner`` for the attempt's output from ``from_index``, in the background;
        the answer arrives as a ``Replayed`` event."""
        self._work.spawn(self._replay(stream.index, stream.request_id, owner, from_index))

    async def _replay(self, choice: int, request_id: str, owner: str, from_index: int) -> None:
        reply = await self.dispatcher.replay(owner, request_id, from_index)
        self.queue.put_nowait(Replayed(choice, request_id, reply))

    def stray(self, request_id: str, node_id: str) -> None:
        """A node that is not the attempt's owner produced tokens for it: stop it there."""
        self.dispatcher.abort_soon([request_id], [], only_node=node_id)

    def finish(self, choice: int) -> None:
        """The gateway needs no more of this choice (it finished here, say at a stop
        string): abort it now."""
        stream = self.streams[choice]
        if not stream.ended:
            stream.ended = True
            self._let_go(stream.request_id, [])

    def end(self, choice: int) -> None:
        """The backend ended the choice itself (a finish or an error): nothing to abort."""
        self.streams[choice].ended = True

    async def next(self, timeout: float) -> Event:
        """The next event; ``TimeoutError`` after ``timeout`` seconds."""
        return await asyncio.wait_for(self.queue.get(), timeout=max(timeout, 0.0))

    def close(self) -> None:
        """Aborts what still runs and drops the subscriptions. Safe to call twice and from a
        cancelled task: the work is handed to a task of its own."""
        if self.closed:
            return
        self.closed = True
        self._work.cancel()
        leftovers = [s.request_id for s in self.streams if not (s.ended or s.refused)]
        subscriptions = [s.subscription for s in self.streams if s.subscription is not None]
        for stream in self.streams:
            self.dispatcher.in_flight.pop(stream.request_id, None)
            stream.ended = True
        self.dispatcher.abort_soon(leftovers, subscriptions)

    def _let_go(self, request_id: str, subscriptions: list[Subscription]) -> None:
        self.dispatcher.in_flight.pop(request_id, None)
        self.dispatcher.abort_soon([request_id], subscriptions)
