"""Paces a workload against one server: arrival times, conversation order, the cap on
requests in flight.

Each conversation is one task that sends its turns in order. A turn waits for its arrival
time, then for a free slot (``concurrency``; 0 is no cap), and only then is sent, so TTFT
counts from the moment the server could see the request, and a turn never starts before the
previous turn of its conversation has finished.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from crescent.bench.records import RequestRecord
from crescent.bench.workload import BenchRequest, Conversation

#: Sends one request; the float is the round's start on ``time.perf_counter``'s clock.
Send = Callable[[BenchRequest, float], Awaitable[RequestRecord]]
_NO_CAP = 1 << 30


@dataclass(slots=True)
class RoundResult:
    """The records of one round (``sent_s`` from the round's start) and its wall time."""

    records: list[RequestRecord]
    duration_s: float


async def play(
    conversations: Sequence[Conversation],
    send: Send,
    concurrency: int = 0,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> RoundResult:
    """Plays every conversation; records in order of ``index``."""
    slots = asyncio.Semaphore(concurrency if concurrency > 0 else _NO_CAP)
    start = time.perf_counter()

    async def conversation(turns: Conversation) -> list[RequestRecord]:
        records = []
        for request in turns:
            await asyncio.sleep(max(0.0, start + request.arrival_s - time.perf_counter()))
            async with slots:
                record = await send(request, start)
            records.append(record)
            if on_done is not None:
                on_done(record)
        return records

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(conversation(c)) for c in conversations]
    duration = time.perf_counter() - start
    records = sorted((r for t in tasks for r in t.result()), key=lambda r: r.index)
    return RoundResult(records, duration)


def new_record(request: BenchRequest, start: float) -> RequestRecord:
    """The record of ``request``, sent now, before anything is known of its answer."""
    return RequestRecord(
        index=request.index,
        conversation=request.conversation,
        turn=request.turn,
        scheduled_s=request.arrival_s,
        sent_s=time.perf_counter() - start,
        prompt_len=len(request.prompt),
        max_tokens=request.max_tokens,
    )
