"""Non-negative least squares with a weak prior, on running sums (pure Python, three features).

The fit needs only the sums ``Σ x xᵀ``, ``Σ x y`` and ``Σ y²`` of its samples, so a sliding
window of samples is kept as those sums: adding or evicting a sample costs O(1), and a pooled
fit over many nodes adds their sums.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

NUM_FEATURES = 3


def _zeros() -> list[list[float]]:
    return [[0.0] * NUM_FEATURES for _ in range(NUM_FEATURES)]


@dataclass(slots=True)
class Moments:
    """The sufficient statistics of a least-squares fit of ``y`` on ``x``. Invariant: equal, up
    to rounding, to the sums over the samples added minus those removed."""

    count: int = 0
    xx: list[list[float]] = field(default_factory=_zeros)
    xy: list[float] = field(default_factory=lambda: [0.0] * NUM_FEATURES)
    yy: float = 0.0

    def add(self, x: Sequence[float], y: float, sign: int = 1) -> None:
        """Adds a sample (``sign=1``) or removes one added before (``sign=-1``)."""
        self.count += sign
        for i in range(NUM_FEATURES):
            self.xy[i] += sign * x[i] * y
            for j in range(NUM_FEATURES):
                self.xx[i][j] += sign * x[i] * x[j]
        self.yy += sign * y * y

    def merge(self, other: Moments) -> None:
        self.count += other.count
        for i in range(NUM_FEATURES):
            self.xy[i] += other.xy[i]
            for j in range(NUM_FEATURES):
                self.xx[i][j] += other.xx[i][j]
        self.yy += other.yy


class SlidingMoments:
    """Owns the last ``size`` samples (features and value) and ``moments``, their sums.
    Invariant: ``moments`` are the sums over ``samples``, rebuilt from them every ``size``
    additions so rounding cannot drift."""

    def __init__(self, size: int) -> None:
        self.samples: deque[tuple[Sequence[float], float]] = deque(maxlen=max(size, 1))
        self.moments = Moments()
        self._since_rebuild = 0

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, x: Sequence[float], y: float) -> None:
        size = self.samples.maxlen or 1
        if len(self.samples) == size:
            old_x, old_y = self.samples[0]
            self.moments.add(old_x, old_y, sign=-1)
        self.samples.append((x, y))
        self.moments.add(x, y)
        self._since_rebuild += 1
        if self._since_rebuild >= size:
            self.moments = Moments()
            for sample_x, sample_y in self.samples:
                self.moments.add(sample_x, sample_y)
            self._since_rebuild = 0


def fit(moments: Moments, prior: Sequence[float], prior_weight: float) -> list[float]:
    """Coefficients ``b ≥ 0`` minimising ``Σ (y - b·x)²`` plus a pull towards ``prior``.

    Columns are scaled to unit root-mean-square and each scaled coefficient is tied to the
    prior's with weight ``prior_weight`` (in samples): a small weight leaves well-determined
    fits alone but settles the directions the data leave open (all samples the same size, say)
    the prior's way, and keeps the system solvable. The constrained optimum is exact: every set
    of free coefficients is solved and the best feasible one kept. The prior pulled towards
    is scaled to the samples' level first (``_level``).
    """
    if moments.count <= 0:
        return list(prior)
    n = moments.count
    scale = [math.sqrt(max(moments.xx[j][j], 0.0) / n) or 1.0 for j in range(NUM_FEATURES)]
    gram = [
        [moments.xx[i][j] / (scale[i] * scale[j]) for j in range(NUM_FEATURES)]
        for i in range(NUM_FEATURES)
    ]
    zy = [moments.xy[i] / scale[i] for i in range(NUM_FEATURES)]
    theta0 = _level(gram, zy, [p * s for p, s in zip(prior, scale, strict=True)])
    best: tuple[float, list[float]] | None = None
    for size in range(NUM_FEATURES + 1):
        for free in combinations(range(NUM_FEATURES), size):
            theta = _ridge(gram, zy, theta0, free, prior_weight)
            if theta is None or min(theta) < 0:
                continue
            loss = _loss(gram, zy, moments.yy, theta, theta0, prior_weight)
            if best is None or loss < best[0]:
                best = (loss, theta)
    assert best is not None  # no free coefficient (all zero) is always feasible
    return [t / s for t, s in zip(best[1], scale, strict=True)]


def _level(gram: list[list[float]], zy: list[float], theta0: list[float]) -> list[float]:
    """``theta0`` scaled by the least-squares factor that best fits the samples: the prior
    gives the shape of the cost (how it splits between the features), the samples its level.
    Pulled towards the unscaled prior, a node faster than the prior whose samples leave a
    direction open (every step the same size) would have the slack land on the non-negativity
    bound: a per-token cost of zero, and every long prompt predicted as cheap as a short one."""
    norm = sum(
        theta0[i] * gram[i][j] * theta0[j] for i in range(NUM_FEATURES) for j in range(NUM_FEATURES)
    )
    if norm <= 0:
        return theta0
    factor = sum(t * b for t, b in zip(theta0, zy, strict=True)) / norm
    return [t * max(factor, 0.0) for t in theta0]


def _ridge(
    gram: list[list[float]], zy: list[float], theta0: list[float], free: tuple[int, ...], lam: float
) -> list[float] | None:
    """The regularised least-squares optimum with only ``free`` coefficients non-zero."""
    theta = [0.0] * NUM_FEATURES
    if not free:
        return theta
    matrix = [[gram[i][j] + (lam if i == j else 0.0) for j in free] for i in free]
    solved = _solve(matrix, [zy[i] + lam * theta0[i] for i in free])
    if solved is None:
        return None
    for i, value in zip(free, solved, strict=True):
        theta[i] = value
    return theta


def _loss(
    gram: list[list[float]],
    zy: list[float],
    yy: float,
    theta: list[float],
    theta0: list[float],
    lam: float,
) -> float:
    """``Σ (y - θ·z)² + lam·|θ - θ0|²``, from the sums."""
    quad = sum(
        theta[i] * gram[i][j] * theta[j] for i in range(NUM_FEATURES) for j in range(NUM_FEATURES)
    )
    residual = yy - 2 * sum(t * b for t, b in zip(theta, zy, strict=True)) + quad
    return residual + lam * sum((t - t0) ** 2 for t, t0 in zip(theta, theta0, strict=True))


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is singular."""
    n = len(rhs)
    a = [[*row, b] for row, b in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x
