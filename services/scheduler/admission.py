"""The scheduler's bounded queue: a request beyond ``max_pending`` placements in flight is
refused at once (429), before any lookup or pricing, so an overload costs each extra request
microseconds instead of growing a queue whose every member would miss its objective anyway.

Pure: the adapter calls ``enter`` when a request arrives and ``leave`` when its placement is
decided (placed, rejected or failed), with its own clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.scheduler.policy import Rejection

#: Bounds of the Retry-After a full queue answers, in seconds.
MIN_RETRY_S = 1.0
MAX_RETRY_S = 60.0


@dataclass(slots=True)
class AdmissionGate:
    """Owns the number of placements in flight and the end times of the recent ones (the drain
    rate). Invariants: ``pending >= 0``; ``_ended`` is ascending, at most ``window`` long, and
    holds no time older than ``horizon_s`` before the latest call."""

    max_pending: int
    window: int = 256
    horizon_s: float = 10.0
    pending: int = 0
    _ended: deque[float] = field(default_factory=deque)

    def enter(self, now: float, resumed: bool = False) -> Rejection | None:
        """Counts a request in, or refuses it when the queue is full. A resumed request (the
        continuation of one already accepted) always enters."""
        if resumed or self.pending < self.max_pending:
            self.pending += 1
            return None
        reason = (
            f"The scheduler has {self.pending} requests waiting to be placed, its limit; "
            "the servers are overloaded, retry later."
        )
        return Rejection(reason, 429, self.retry_after_s(now), cause="queue_full")

    def leave(self, now: float) -> None:
        """A placement was decided; unmatched calls never take ``pending`` below zero."""
        self.pending = max(self.pending - 1, 0)
        self._ended.append(now)
        if len(self._ended) > self.window:
            self._ended.popleft()
        self._forget_before(now)

    def drain_rate(self, now: float) -> float | None:
        """Placements decided per second over the recent past; None when none was lately."""
        self._forget_before(now)
        if not self._ended:
            return None
        span = now - self._ended[0]
        return len(self._ended) / span if span > 0 else float("inf")

    def retry_after_s(self, now: float) -> float:
        """When a refused request may find room: the time the queue takes to drain to below
        its bound at the current rate (``MIN_RETRY_S`` when the rate is unknown)."""
        rate = self.drain_rate(now)
        if rate is None:
            return MIN_RETRY_S
        excess = self.pending - self.max_pending + 1
        return min(max(excess / rate, MIN_RETRY_S), MAX_RETRY_S)

    def _forget_before(self, now: float) -> None:
        while self._ended and self._ended[0] < now - self.horizon_s:
            self._ended.popleft()
