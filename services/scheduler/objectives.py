"""The time to first token and the time between tokens a request may take, from its own
objectives and the scheduler's. Pure: the caller gives the wall-clock time."""

from __future__ import annotations


def ttft_objective(deadline: float, default_s: float | None, now: float) -> float | None:
    """What is left of a request's TTFT objective at Unix time ``now``: up to its own
    ``deadline`` (set by the gateway from the request's ``ttft_slo_ms`` or its tenant's
    objective; 0 when it has none), and within the scheduler's ``default_s``; the tighter
    of the two when both are set, None when neither is. Never negative: a deadline already
    passed leaves 0, which no prediction meets."""
    if deadline <= 0:
        return default_s
    left = max(deadline - now, 0.0)
    return left if default_s is None else min(left, default_s)


def tbt_objective(asked_s: float, default_s: float | None) -> float | None:
    """The time between tokens a request must be placed to get: its own ``asked_s`` (from its
    ``tbt_slo_ms`` or its tenant's; 0 when it has none) and the scheduler's ``default_s``,
    the tighter of the two when both are set, None when neither is."""
    if asked_s <= 0:
        return default_s
    return asked_s if default_s is None else min(asked_s, default_s)
