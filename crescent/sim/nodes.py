"""Simulated prefill and decode nodes: what each is doing, and the load it reports.

A prefill node serves its queue first come first served, one prompt at a time: it pulls the
cached blocks its placement names (if their holder still has them), then computes the rest in
chunks (``services.scheduler.timing.prefill_seconds`` of the cost model). A decode node runs
continuous batching: steps back to back while any sequence runs, a step of ``b`` sequences over
``c`` cached tokens taking ``f(b, c)`` (``decode_step_seconds``), every sequence making a token
per step; sequences join and leave at step boundaries. Within a stretch of steps with the same
batch the context grows by ``b`` tokens a step, so step ``k`` takes ``a + k * per_attention_s
* b`` and the boundaries have a closed form: a stretch costs one event, not one per step.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from crescent.sim.pool import BlockPool
from services.scheduler.cluster import NodeLoad
from services.scheduler.policy import Placement
from services.scheduler.timing import StepCoefficients, decode_step_seconds
from shared.cluster_messages import MAX_FINISHING


@dataclass(slots=True, eq=False)
class Job:
    """One trace request on its way through the cluster (times in simulated seconds)."""

    index: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    keys: tuple[bytes, ...] = ()  # ``pool.block_key`` of each hash id: how pools name them
    listed: tuple[bytes, ...] = ()  # those the catalogue keeps (``catalogue.matched_by``)
    placement: Placement | None = None
    queued_tokens: int = 0  # what its prefill node counts for it while it waits
    cached_blocks: int = 0
    first_token: float = math.nan
    finished: float = math.nan
    blocks: int = 0  # KV blocks it reserves on its decode node
    end_step: int = 0
    join_step: int = 0
    rejected: bool = False

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        """Seconds per output token after the first (0 for a single-token answer)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.finished - self.first_token) / (self.output_tokens - 1)


@dataclass(slots=True)
class PrefillNode:
    """A prefill node's queue and pool. Invariant: ``load.queued_tokens`` is the sum of the
    ``queued_tokens`` of the jobs in ``queue`` and of ``current``."""

    load: NodeLoad
    pool: BlockPool
    queue: deque[Job] = field(default_factory=deque)
    current: Job | None = None

    def enqueue(self, job: Job, now: float) -> None:
        self.queue.append(job)
        self.load.queued_tokens += job.queued_tokens
        self.report(now)

    def finish(self, job: Job, now: float) -> None:
        self.current = None
        self.load.queued_tokens -= job.queued_tokens
        self.report(now)

    def report(self, now: float) -> None:
        """A heartbeat: the queue counts what was placed so far."""
        self.load.placed_tokens = 0
        self.load.last_seen = now


@dataclass(slots=True)
class DecodeNode:
    """A decode node's batch, in stretches of steps with a fixed batch.

    Invariants: ``steps`` steps were done by ``start`` (a step boundary), when the batch held
    ``context`` tokens; ``ending`` holds ``(end step, job index, job)`` of every running job;
    ``reserved`` is the blocks of the running jobs. ``wake`` is the time of the next boundary
    anything happens at, ``wake_steps`` its steps from ``start``."""

    load: NodeLoad
    coef: StepCoefficients
    pool: BlockPool | None
    ending: list[tuple[int, int, Job]] = field(default_factory=list)
    waiting: deque[Job] = field(default_factory=deque)
    start: float = 0.0
    steps: int = 0
    context: int = 0
    reserved: int = 0
    wake: float = math.inf
    wake_steps: int = 0

    @property
    def batch(self) -> int:
        return len(self.ending)

    def _pace(self) -> tuple[float, float]:
        """The stretch's first step and what each step adds to the next: step ``k`` (from 0)
        takes ``a + k * b``."""
        batch = len(self.ending)
        return decode_step_seconds(self.coef, batch, self.context), (
            self.coef.per_attention_s * batch
        )

    def elapsed(self, n: int) -> float:
        """Seconds from ``start`` to the end of the ``n``-th step of the stretch."""
        a, b = self._pace()
        return n * a + b * n * (n - 1) / 2

    def steps_by(self, t: float) -> int:
        """Steps of the stretch done by ``t``."""
        span = t - self.start
        if not self.ending or span <= 0:
            return 0
        a, b = self._pace()
        if b <= 0:
            n = int(span / a) if a > 0 else 1 << 40
        else:
            c = a - b / 2
            n = int((-c + math.sqrt(c * c + 2 * b * span)) / b)
        # ``elapsed`` inline (the same operations): the root is off by a step at most.
        while (n + 1) * a + b * (n + 1) * n / 2 <= span:
            n += 1
        while n > 0 and n * a + b * n * (n - 1) / 2 > span:
            n -= 1
        return n

    def advance(self, n: int, now: float) -> list[Job]:
        """Ends the stretch after ``n`` steps at ``now``; returns the jobs done by then."""
        self.steps += n
        self.context += self.batch * n
        self.start = now
        done = []
        while self.ending and self.ending[0][0] <= self.steps:
            _, _, job = heapq.heappop(self.ending)
            job.finished = now
            self.context -= job.prompt_tokens + 1 + (self.steps - job.join_step)
            self.reserved -= job.blocks
            done.append(job)
        return done

    def admit(self) -> list[Job]:
        """Starts the waiting jobs that fit (the first always does on an idle node)."""
        joined = []
        room = self.load.total_blocks - self.reserved
        while self.waiting and (self.waiting[0].blocks <= room or not self.ending):
            job = self.waiting.popleft()
            job.join_step = self.steps
            job.end_step = self.steps + job.output_tokens - 1
            heapq.heappush(self.ending, (job.end_step, job.index, job))
            self.context += job.prompt_tokens + 1
            self.reserved += job.blocks
            room -= job.blocks
            joined.append(job)
        return joined

    def plan(self) -> None:
        """The next boundary anything happens at: the next job's end."""
        if not self.ending:
            self.wake, self.wake_steps = math.inf, 0
            return
        self.wake_steps = self.ending[0][0] - self.steps
        self.wake = self.start + self.elapsed(self.wake_steps)

    def join_boundary(self, now: float) -> tuple[int, float]:
        """The first boundary at or after ``now``: (steps from ``start``, time)."""
        n = self.steps_by(now)
        at = self.start + self.elapsed(n)
        if at < now:
            n += 1
            at = self.start + self.elapsed(n)
        return n, at

    def report(self, now: float) -> None:
        """A heartbeat at ``now``, a step boundary or not."""
        load = self.load
        done = self.steps + self.steps_by(now)
        load.running_seqs = self.batch + len(self.waiting)
        load.free_blocks = load.total_blocks - self.reserved
        load.finishing = tuple(
            sorted(
                (end - done, job.prompt_tokens + 1 + done - job.join_step)
                for end, _, job in self.ending
            )[:MAX_FINISHING]
        )
        load.last_seen = now
