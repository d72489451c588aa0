"""How fast requests are being placed on each decode node, by the time between tokens they
were placed under: the load still to come during a request's decode, which no heartbeat and
no placed request shows yet. Pure: the caller gives the times.

Only placements under a looser objective than a request's own can push a batch past that
objective later: every placement under the same or a tighter one is itself refused unless
the batch it joins steps in time, and all sequences of a batch share its step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Seconds over which past placements are averaged (an exponential window).
WINDOW_S = 30.0
#: Distinct objectives tracked per node; beyond them a placement counts with the loosest.
MAX_OBJECTIVES = 64


@dataclass(slots=True)
class ArrivalRates:
    """Owns, per decode node and per objective (seconds between tokens; ``inf``: none), a
    decayed count of placements. Invariant: a count is as of its node's ``_at``, every
    placement weighing ``exp(-age / window_s)``; in a steady stream of ``r`` a second the
    count tends to ``r · window_s``, which ``rate`` reads back."""

    window_s: float = WINDOW_S
    _counts: dict[str, dict[float, float]] = field(default_factory=dict)
    _at: dict[str, float] = field(default_factory=dict)

    def add(self, node_id: str, at: float, tbt_slo_s: float | None) -> None:
        counts = self._decay(node_id, at)
        objective = math.inf if tbt_slo_s is None else tbt_slo_s
        if objective not in counts and len(counts) >= MAX_OBJECTIVES:
            objective = max(counts)
        counts[objective] = counts.get(objective, 0.0) + 1.0

    def rate(self, node_id: str, at: float, looser_than: float | None = None) -> float:
        """Placements per second on ``node_id`` lately, as seen at ``at``: those under an
        objective looser than ``looser_than`` (None: every one)."""
        counts = self._counts.get(node_id)
        if not counts:
            return 0.0
        bound = -math.inf if looser_than is None else looser_than
        total = sum(c for objective, c in counts.items() if objective > bound)
        return total * self._weight(node_id, at) / self.window_s

    def forget(self, node_id: str) -> None:
        self._counts.pop(node_id, None)
        self._at.pop(node_id, None)

    def _weight(self, node_id: str, at: float) -> float:
        return math.exp(-max(at - self._at.get(node_id, at), 0.0) / self.window_s)

    def _decay(self, node_id: str, at: float) -> dict[float, float]:
        """The node's counts brought forward to ``at`` (never back), those worn to nothing
        dropped."""
        counts = self._counts.setdefault(node_id, {})
        last = self._at.get(node_id)
        if last is None or at > last:
            weight = self._weight(node_id, at)
            for objective in [o for o, c in counts.items() if c * weight < 1e-3]:
                del counts[objective]
            for objective in counts:
                counts[objective] *= weight
            self._at[node_id] = at
        return counts
