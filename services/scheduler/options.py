"""The scheduler adapter's settings, grouped (main.py builds them from ``SchedulerSettings``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.scheduler.placer import PlacementOptions


@dataclass(frozen=True, slots=True)
class SchedulerOptions:
    """The adapter's settings (main.py builds them from ``SchedulerSettings``): the secret
    prompts are hashed under and its fingerprint, the placement rule, how long an offer's
    answer is waited for, prefetching, and how many requests may be placed at once."""

    cache_secret: str
    secret_fingerprint: str = ""
    placement: PlacementOptions = field(default_factory=PlacementOptions)
    ack_timeout_s: float = 1.0
    prefetch: bool = True
    max_pending: int = 256
