"""How long a KV hand-off from a prefill node to a decode node takes, fitted to the hand-offs
the decode nodes time and report.

A hand-off of ``blocks`` blocks is modelled as ``base_s + per_block_s * blocks``: the base is
what every hand-off pays (the checksums' setup, the bus round trip, reserving room, the pin),
the slope the bytes crossing the transfer layer. It delays the request's second token, not its
first (the prefill node sends that), and it is what prefilling on the decode node saves
(``disaggregation.py``). Pure: no I/O, no framework.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from services.scheduler.fit import SlidingMoments, fit

#: The prior's weight in the fit (as in ``timing.py``): it settles what few samples leave open
#: (all of one size, say) without biasing a fit that the samples determine.
PRIOR_WEIGHT = 1e-3


@dataclass(frozen=True, slots=True)
class HandoffCoefficients:
    """The two coefficients of the hand-off model; both non-negative."""

    base_s: float
    per_block_s: float

    def seconds(self, blocks: int) -> float:
        return self.base_s + self.per_block_s * max(blocks, 0)


def handoff_prior(
    pull_overhead_s: float, block_bytes: int, bandwidth: float
) -> HandoffCoefficients:
    """What a hand-off is assumed to cost before any is measured: two round trips of a pull's
    fixed cost (the offer and the pin) and the blocks' bytes at the transfer bandwidth."""
    return HandoffCoefficients(2 * pull_overhead_s, block_bytes / max(bandwidth, 1.0))


class HandoffTimes:
    """Owns the last ``window`` hand-off samples of the cluster (pooled over decode nodes: the
    cost is the transfer layer's and the prefill nodes', not one decode node's) and their sums.

    Invalid samples (negative or non-finite) are dropped.
    """

    def __init__(self, window: int = 256) -> None:
        self.sums = SlidingMoments(window)

    def add(self, samples: Iterable[tuple[int, float]]) -> None:
        for blocks, seconds in samples:
            if blocks >= 0 and 0.0 <= seconds < float("inf"):
                self.sums.add(_features(blocks), seconds)

    def coefficients(self, prior: HandoffCoefficients) -> HandoffCoefficients:
        """The non-negative least-squares fit of the samples, pulled towards ``prior``."""
        moments = self.sums.moments
        if moments.count <= 0:
            return prior
        base, per_block, _ = fit(moments, (prior.base_s, prior.per_block_s, 0.0), PRIOR_WEIGHT)
        return HandoffCoefficients(base, per_block)


def _features(blocks: int) -> tuple[float, float, float]:
    # fit() takes three features; the third is unused (always 0, so its coefficient stays 0).
    return (1.0, float(blocks), 0.0)
