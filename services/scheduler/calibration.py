"""How far the predicted times to first token are off, per prefill node, measured.

A prefill node reports, for each task, the time the scheduler predicted from the task's
arrival to its first token and the time it took. The ratio of the two, over the recent
tasks, scales what an objective is checked against: a node whose predictions run short
(a busy host, a model the step fit does not capture) has its predictions stretched before
a request is let in, so admitted requests keep the objective. Pure.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

WINDOW = 32
#: Below this many samples a node's predictions are taken as they are.
MIN_SAMPLES = 8
QUANTILE = 0.95
LOWEST, HIGHEST = 0.5, 4.0
#: Predictions shorter than this carry no useful ratio (a cached prompt, say).
MIN_PREDICTED_S = 0.02
#: Ratios older than this are dropped. Without it a node stretched past the objective would
#: be refused every request, report no new ratio, and stay refused after the cause passed
#: (a busy spell of its host); so a node that got no task for this long is taken at its
#: predictions again, and the ratios its next tasks report stretch them anew if still due.
MAX_AGE_S = 30.0


@dataclass(slots=True)
class TtftCalibration:
    """Owns the recent actual/predicted ratios of each node, with when they came. Invariant:
    at most ``WINDOW`` ratios per node, none older than ``MAX_AGE_S`` at the last ``add``,
    oldest dropped first."""

    ratios: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)

    def add(self, node_id: str, samples: Iterable[tuple[float, float]], now: float) -> None:
        """Records a heartbeat's samples (possibly none) at ``now`` (monotonic)."""
        window = self.ratios.setdefault(node_id, deque(maxlen=WINDOW))
        while window and now - window[0][0] > MAX_AGE_S:
            window.popleft()
        for predicted, actual in samples:
            if predicted >= MIN_PREDICTED_S and actual > 0:
                window.append((now, actual / predicted))

    def scale(self, node_id: str) -> float:
        """What to multiply ``node_id``'s predicted TTFT by before checking an objective:
        the ``QUANTILE`` of its recent ratios, within [``LOWEST``, ``HIGHEST``]; 1 until it
        has ``MIN_SAMPLES``."""
        window = self.ratios.get(node_id)
        if window is None or len(window) < MIN_SAMPLES:
            return 1.0
        ordered = sorted(ratio for _, ratio in window)
        at = min(len(ordered) - 1, int(QUANTILE * len(ordered)))
        return min(max(ordered[at], LOWEST), HIGHEST)

    def forget(self, node_id: str) -> None:
        self.ratios.pop(node_id, None)
