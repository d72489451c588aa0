"""Runs a prepared request over the bus: waits until every choice is accepted, then turns the
merged TokenChunks into per-choice deltas until all choices finish. No HTTP, no NATS here."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from services.gateway import errors
from services.gateway.dispatch import Dispatcher, Flight
from services.gateway.output import BackendError, ChoiceAssembler, Delta
from services.gateway.requests import PreparedRequest
from shared.messages import TokenChunk
from shared.model.tokenizer import Tokenizer


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


class Run:
    """One API request in flight.

    Owns its ``Flight`` and one ``ChoiceAssembler`` per choice. Invariant: deltas come out in
    the order chunks were consumed, each choice ends with exactly one delta carrying its finish
    reason, and ``close`` (always called by the owner) aborts whatever still runs.
    """

    def __init__(
        self,
        request: PreparedRequest,
        flight: Flight,
        tokenizer: Tokenizer,
        first_token_timeout_s: float,
        request_timeout_s: float,
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
        self._by_id = {c.request.request_id: c.index for c in request.choices}
        self._answered: set[int] = set()
        self._backlog: list[tuple[int, Delta]] = []
        self.timing = Timing(start=time.monotonic())
        self._first_deadline = self.timing.start + first_token_timeout_s
        self._deadline = self.timing.start + request_timeout_s
        self._request_timeout_s = request_timeout_s

    @property
    def done(self) -> bool:
        return all(c.finished for c in self.choices)

    async def accept(self) -> None:
        """Returns once every choice produced output; raises the ``ApiError`` the client
        should get instead (429/503 from the backend, or 503 when nobody answered in time)."""
        while len(self._answered) < len(self.choices):
            remaining = self._first_deadline - time.monotonic()
            try:
                chunk = await self._flight.next(remaining)
            except TimeoutError:
                raise errors.unavailable(
                    "No backend answered the request in time; is the scheduler running?"
                ) from None
            self._backlog.extend(self._route(chunk))

    async def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        """Yields ``(choice index, delta)`` until every choice has finished."""
        while self._backlog:
            yield self._backlog.pop(0)
        while not self.done:
            remaining = self._deadline - time.monotonic()
            try:
                chunk = await self._flight.next(remaining)
            except TimeoutError:
                raise errors.timed_out(self._request_timeout_s) from None
            for item in self._route(chunk):
                yield item

    async def collect(self) -> None:
        """Consumes the whole output (for non-streaming responses)."""
        async for _ in self.deltas():
            pass

    def _route(self, chunk: TokenChunk) -> list[tuple[int, Delta]]:
        index = self._by_id.get(chunk.request_id)
        if index is None:
            return []
        self._answered.add(index)
        choice = self.choices[index]
        if choice.finished:
            return []
        try:
            delta = choice.add(chunk)
        except BackendError as exc:
            raise errors.from_backend(exc.code, exc.message, exc.retry_after_s) from exc
        if chunk.token_ids:
            self.timing.note(index, time.monotonic())
        if choice.finished:
            # Finished here (stop string, max_tokens) means the backend may still be busy.
            self._flight.finish(chunk.request_id)
        return [(index, delta)] if delta else []

    def close(self) -> None:
        self._flight.close()


class Completions:
    """Starts runs: the core behind both generation endpoints.

    Owns the dispatcher, the tokenizer used for output and the time limits.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        tokenizer: Tokenizer,
        first_token_timeout_s: float,
        request_timeout_s: float,
    ) -> None:
        self.dispatcher = dispatcher
        self.tokenizer = tokenizer
        self.first_token_timeout_s = first_token_timeout_s
        self.request_timeout_s = request_timeout_s

    async def start(self, request: PreparedRequest) -> Run:
        """Publishes the request and waits until it is accepted; the caller must ``close`` the
        returned run. On failure everything already sent is aborted before the error rises."""
        flight = await self.dispatcher.open([c.request for c in request.choices])
        run = Run(
            request, flight, self.tokenizer, self.first_token_timeout_s, self.request_timeout_s
        )
        try:
            await run.accept()
        except BaseException:
            run.close()
            raise
        return run
