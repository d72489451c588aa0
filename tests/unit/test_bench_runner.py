"""The runner's pacing rules: a turn waits for the previous one, the cap holds, arrivals wait."""

from __future__ import annotations

import asyncio
import itertools
import time

from crescent.bench.records import RequestRecord
from crescent.bench.runner import RoundResult, new_record, play
from crescent.bench.workload import BenchRequest, Conversation


class FakeServer:
    """Answers after a delay of its own per request and notes when each one ran."""

    def __init__(self, delays: dict[int, float]) -> None:
        self.delays = delays
        self.spans: dict[int, tuple[float, float]] = {}
        self.in_flight = 0
        self.most_in_flight = 0

    async def send(self, request: BenchRequest, start: float) -> RequestRecord:
        record = new_record(request, start)
        began = time.perf_counter()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(self.delays.get(request.index, 0.01))  # its service time
        self.in_flight -= 1
        self.spans[request.index] = (began, time.perf_counter())
        record.ok = True
        return record


def _conversations(turns: list[int], arrival_s: float = 0.0) -> list[Conversation]:
    out: list[Conversation] = []
    index = 0
    for c, n in enumerate(turns):
        out.append(tuple(BenchRequest(index + t, c, t, arrival_s, (1, 2, 3), 4) for t in range(n)))
        index += n
    return out


def _run(conversations: list[Conversation], server: FakeServer, cap: int = 0) -> RoundResult:
    return asyncio.run(play(conversations, server.send, cap))


def test_a_turn_never_starts_before_the_previous_turn_finished() -> None:
    conversations = _conversations([4, 3, 1])
    # Early turns slow, later ones fast: a runner that sent turns by arrival time alone
    # (all arrive at 0) would start them while their predecessors still run.
    server = FakeServer({0: 0.05, 1: 0.04, 4: 0.05, 5: 0.03})
    result = _run(conversations, server)
    assert [r.index for r in result.records] == list(range(8))
    for conversation in conversations:
        for before, after in itertools.pairwise(conversation):
            assert server.spans[after.index][0] >= server.spans[before.index][1]
    # Different conversations did run side by side.
    assert server.most_in_flight == 3


def test_the_cap_bounds_requests_in_flight() -> None:
    server = FakeServer({})
    result = _run(_conversations([1] * 12), server, cap=3)
    assert server.most_in_flight == 3
    assert len(result.records) == 12 and all(r.ok for r in result.records)


def test_requests_wait_for_their_arrival_time() -> None:
    server = FakeServer({})
    conversations = _conversations([1, 1], arrival_s=0.0)
    late = BenchRequest(2, 2, 0, 0.08, (1,), 1)
    result = _run([*conversations, (late,)], server)
    assert result.records[2].sent_s >= 0.08
    # Not held back for the late one: served before it was even sent (an order, not a time).
    assert server.spans[0][1] <= server.spans[2][0]
    assert result.duration_s >= 0.08 + 0.01
    assert result.records[2].scheduled_s == 0.08
