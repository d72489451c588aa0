"""Runs a prepared request over the bus: submits every choice, turns the TokenChunks that come
back into per-choice deltas, and keeps each choice going when its node fails, until all finish.
No HTTP, no NATS here."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from services.gateway import errors
from services.gateway.flight import Arrived, ChoiceStream, Event, Flight, Moved, Replayed
from services.gateway.output import BackendError, ChoiceAssembler, Delta
from services.gateway.phases import RequestPhases
from services.gateway.recovery import Act, ChoiceWatch, RecoveryPolicy
from services.gateway.requests import PreparedRequest
from shared import phases
from shared.messages import PREDICTED_TTFT_MARGIN, ReplayReply, SubmitReply, TokenChunk
from shared.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)

#: How often a run looks at its choices when no event wakes it.
TICK_S = 0.2
#: How long after the bus came back a run asks the nodes what it missed.
REPROBE_DELAY_S = 1.0


@dataclass(slots=True)
class Timing:
    """When tokens arrived, for the latency histograms."""

    start: float
    first_token: float | None = None
    first_by_choice: dict[int, float] = field(default_factory=dict)
    last_by_choice: dict[int, float] = field(default_factory=dict)

    def note(self, index: int, now: float) -> None:
        if self.first_token is None:
            self.first_token = now
        self.first_by_choice.setdefault(index, now)
        self.last_by_choice[index] = now

    def time_per_output_token(self, index: int, tokens: int) -> float | None:
        first, last = self.first_by_choice.get(index), self.last_by_choice.get(index)
        if first is None or last is None or tokens < 2:
            return None
        return (last - first) / (tokens - 1)


@dataclass(frozen=True, slots=True)
class Limits:
    first_token_timeout_s: float
    request_timeout_s: float
    recovery: RecoveryPolicy = field(default_factory=RecoveryPolicy)


class Run:
    """One API request in flight.

    Owns its ``Flight`` and one ``ChoiceAssembler`` per choice. Invariants: deltas come out in
    the order chunks were consumed, each choice ends with exactly one delta carrying its finish
    reason, no token is consumed twice or skipped (chunks are placed by completion position,
    whichever attempt sent them), and ``close`` (always called by the owner) aborts whatever
    still runs.
    """

    def __init__(
        self,
        request: PreparedRequest,
        flight: Flight,
        tokenizer: Tokenizer,
        limits: Limits,
        alive: Callable[[str, str, float], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.request = request
        self.choices = [
            ChoiceAssembler(
                tokenizer,
                request.prompts[c.prompt_index],
                c.request.sampling.max_tokens,
                request.options,
            )
            for c in request.choices
        ]
        self._flight = flight
        self._limits = limits
        self._alive = alive
        self._clock = clock
        self._answered: set[int] = set()
        self._backlog: list[tuple[int, Delta]] = []
        self._placed: dict[str, str] = {}  # the first choice's nodes, as the scheduler placed it
        self.timing = Timing(start=clock())
        self.phases = RequestPhases()
        self._first_deadline = self.timing.start + limits.first_token_timeout_s
        self._deadline = self.timing.start + limits.request_timeout_s

    @property
    def done(self) -> bool:
        return all(c.finished for c in self.choices)

    @property
    def resumes(self) -> int:
        return sum(s.watch.resumes for s in self._flight.streams if s.watch is not None)

    async def accept(self) -> None:
        """Submits every choice and returns once each produced output; raises the
        ``ApiError`` the client should get instead (429/503 from the scheduler, 400 from a
        node, or 504 when no first token came in time)."""
        replies = await self._flight.start()
        now = self._clock()
        self.phases.gateway(phases.SUBMIT, now - self.timing.start)
        if replies:
            self.phases.gateway(phases.PLACEMENT, replies[0].placement_s)
            self._placed = {
                "prefill_node": replies[0].prefill_node,
                "decode_node": replies[0].decode_node,
            }
        # The timeouts bound what a request may take beyond its predicted first token.
        predicted = max((r.predicted_ttft_s for r in replies), default=0.0)
        self._first_deadline += PREDICTED_TTFT_MARGIN * predicted
        self._deadline += PREDICTED_TTFT_MARGIN * predicted
        # Until its first token a choice is bounded by the first-token timeout, not the stall
        # timeout: its node is probed meanwhile, and liveness catches a dead one.
        for stream, reply in zip(self._flight.streams, replies, strict=True):
            stream.watch = ChoiceWatch(
                reply.prefill_node, reply.prefill_epoch, now, now, quiet_until=self._first_deadline
            )
        while len(self._answered) < len(self.choices):
            if self._clock() >= self._first_deadline:
                seconds = self._limits.first_token_timeout_s
                raise errors.timed_out(seconds, "No first token came")
            self._backlog.extend(await self._wait(self._first_deadline))

    def breakdown(self) -> dict[str, float]:
        """Where the first choice's time went, by phase (``RequestPhases.breakdown``)."""
        timing, parse = self.timing, self.phases.timed.get(phases.PARSE, 0.0)
        first = timing.first_by_choice.get(0)
        ttft = None if first is None else parse + first - timing.start
        itl = timing.time_per_output_token(0, self.choices[0].completion_tokens)
        return self.phases.breakdown(ttft, itl)

    def debug_view(self) -> dict[str, Any]:
        """What ``GET /debug/requests/{id}`` shows of this run once it ended."""
        first = self.request.choices[0]
        return {
            "id": self.request.id,
            "prompt_tokens": len(self.request.prompts[first.prompt_index]),
            "completion_tokens": self.choices[0].completion_tokens,
            "resumes": self.resumes,
            "placed": self._placed,
            "phases_s": self.breakdown(),
        }

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        """Yields ``(choice index, delta)`` until every choice has finished."""
        while self._backlog:
            yield self._backlog.pop(0)
        while not self.done:
            if self._clock() >= self._deadline:
                raise errors.timed_out(self._limits.request_timeout_s)
            for item in await self._wait(self._deadline):
                yield item

    async def collect(self) -> None:
        """Consumes the whole output (for non-streaming responses)."""
        async for _ in self.deltas():
            pass

    async def _wait(self, deadline: float) -> list[tuple[int, Delta]]:
        """Handles the next event, or looks after the choices when none came for a tick."""
        timeout = min(TICK_S, deadline - self._clock())
        try:
            event = await self._flight.next(timeout)
        except TimeoutError:
            self._supervise()
            return []
        out = self._handle(event)
        self._supervise()
        return out

    def _handle(self, event: Event) -> list[tuple[int, Delta]]:
        stream = self._flight.streams[event.choice]
        if event.request_id != stream.request_id or stream.watch is None:
            return []  # from an attempt that was superseded
        if isinstance(event, Arrived):
            return self._route(stream, event.chunk)
        if isinstance(event, Replayed):
            return self._replayed(stream, event.reply)
        return self._moved(stream, event)

    def _route(self, stream: ChoiceStream, chunk: TokenChunk) -> list[tuple[int, Delta]]:
        index, watch = stream.index, stream.watch
        assert watch is not None
        choice = self.choices[index]
        if choice.finished:
            return []
        self._answered.add(index)
        if stream.offset > stream.base.sampling.output_offset:
            chunk.num_cached_tokens = 0  # usage reports what the first attempt found cached
            chunk.cached_by_tier = {}
        if self._stray(stream, chunk):
            return []
        if chunk.phases and index == 0:
            self.phases.from_node(chunk.phases)
        before = choice.next_index
        try:
            delta = choice.add(chunk)
        except BackendError as exc:
            self._flight.end(index)
            raise errors.from_backend(exc.code, exc.message, exc.retry_after_s) from exc
        now = self._clock()
        watch.on_chunk(chunk, choice.next_index > before, now)
        if choice.next_index > before:
            self.timing.note(index, now)
        if chunk.finish_reason is not None or chunk.error is not None:
            self._flight.end(index)  # the backend is done with it
        if choice.finished:
            # Finished here (stop string, max_tokens) means the backend may still be busy.
            self._flight.finish(index)
        return [(index, delta)] if delta else []

    def _stray(self, stream: ChoiceStream, chunk: TokenChunk) -> bool:
        """True for tokens from a node that does not serve the attempt: after its owner
        notice, only the named node does (a second node that took the hand-off, whose
        acknowledgement was lost, is told to stop). Before the notice, tokens past the first
        mark the node that took the hand-off, even when the notice itself is lost."""
        watch = stream.watch
        assert watch is not None
        node = chunk.node_id
        if not chunk.token_ids or not node or node == watch.owner:
            return False
        if watch.noticed:
            self._flight.stray(stream.request_id, node)
            return True
        if chunk.index > stream.offset:
            watch.owner, watch.owner_epoch = node, chunk.epoch
            watch.owner_since = self._clock()
        return False

    def _replayed(self, stream: ChoiceStream, reply: ReplayReply | None) -> list[tuple[int, Delta]]:
        watch = stream.watch
        assert watch is not None
        if reply is not None and reply.owner and not reply.token_ids:
            watch.replay_done()
            watch.owner, watch.owner_epoch = reply.owner, reply.owner_epoch
            watch.owner_since = self._clock()
            return []
        ended = reply is not None and (reply.finish_reason or reply.error)
        if reply is None or not reply.known or not (reply.running or ended or reply.owner):
            self._act(stream, watch.replay_failed(self._limits.recovery))
            return []
        watch.replay_done()
        if reply.owner:
            watch.owner, watch.owner_epoch = reply.owner, reply.owner_epoch
            watch.owner_since = self._clock()
        chunk = TokenChunk(
            request_id=stream.request_id,
            index=reply.index,
            token_ids=reply.token_ids,
            logprobs=reply.logprobs,
            finish_reason=reply.finish_reason,
            num_cached_tokens=reply.num_cached_tokens,
            cached_by_tier=reply.cached_by_tier,
            error=reply.error,
            error_code=reply.error_code,
        )
        return self._route(stream, chunk)

    def _moved(self, stream: ChoiceStream, event: Moved) -> list[tuple[int, Delta]]:
        watch = stream.watch
        assert watch is not None
        stream.busy = False
        if event.error is not None:
            self._flight.end(stream.index)
            raise event.error
        reply: SubmitReply | None = event.reply
        assert reply is not None
        quiet_for = PREDICTED_TTFT_MARGIN * reply.predicted_ttft_s
        watch.accepted(reply.prefill_node, reply.prefill_epoch, self._clock(), quiet_for)
        return []

    def _supervise(self) -> None:
        now, flight = self._clock(), self._flight
        # After the bus came back, every choice asks its node what it missed; not at once:
        # the nodes reconnect too, and one asked before it subscribes again seems to be gone.
        back = flight.reconnected_at
        probe_all = back is not None and now - back >= REPROBE_DELAY_S
        if probe_all:
            flight.reconnected_at = None
        for stream in flight.streams:
            watch, choice = stream.watch, self.choices[stream.index]
            if watch is None or choice.finished or stream.busy:
                continue
            if probe_all and watch.asked_at is None:
                watch.asked_at = now
                flight.replay(stream, watch.owner, choice.next_index)
                continue
            alive = self._alive(watch.owner, watch.owner_epoch, watch.owner_since)
            self._act(stream, watch.decide(now, alive, choice.has_gap, self._limits.recovery))

    def _act(self, stream: ChoiceStream, act: Act) -> None:
        watch, choice = stream.watch, self.choices[stream.index]
        assert watch is not None
        if act is Act.REPLAY:
            self._flight.replay(stream, watch.owner, choice.next_index)
        elif act is Act.RESUME:
            log.warning(
                "resuming choice %d of %s from token %d: %s (was on %s, move %d)",
                stream.index, self.request.id, choice.next_index, watch.reason,
                watch.owner or "no node yet", watch.resumes,
            )  # fmt: skip
            self._flight.resume(stream, list(choice.token_ids))
        elif act is Act.FAIL:
            self._flight.end(stream.index)
            raise errors.unavailable(f"The request could not be completed: {watch.reason}.")

    def close(self) -> None:
        self._flight.close()
