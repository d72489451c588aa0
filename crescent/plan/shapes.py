"""What a plan is made of: the objectives, a cluster's shape (its prefill and decode node
counts), one shape's simulated outcome, the search's limits and its answer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Objectives:
    """What the cluster must do: TTFT and TPOT under these (seconds) for at least the share
    ``attainment`` of the requests (refused ones count as missing both)."""

    ttft_s: float
    tpot_s: float
    attainment: float

    def too_many(self, missed: float) -> bool:
        """Whether a share ``missed`` of requests missing one objective is more than may
        miss: the share meeting that objective alone is below the required attainment."""
        return 1.0 - missed < self.attainment


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """A cluster's size: its prefill and decode node counts, each at least 1."""

    prefill: int
    decode: int

    @property
    def nodes(self) -> int:
        return self.prefill + self.decode

    def smaller(self) -> tuple[Shape, ...]:
        """The shapes with one prefill node fewer and one decode node fewer, where they exist."""
        fewer = (Shape(self.prefill - 1, self.decode), Shape(self.prefill, self.decode - 1))
        return tuple(s for s in fewer if s.prefill >= 1 and s.decode >= 1)

    def covers(self, other: Shape) -> bool:
        """No fewer nodes of either kind than ``other``."""
        return self.prefill >= other.prefill and self.decode >= other.decode


@dataclass(frozen=True, slots=True)
class Outcome:
    """One shape's simulated replay. ``ttft_s`` and ``tpot_s``: the latencies the required
    share of requests stays within (the attainment quantile; refused requests count as
    infinite); ``ttft_missed`` and ``tpot_missed``: the shares missing each objective."""

    shape: Shape
    attainment: float
    ttft_s: float
    tpot_s: float
    ttft_missed: float
    tpot_missed: float
    requests: int
    rejected: int


@dataclass(frozen=True, slots=True)
class Limits:
    """The most nodes of each kind a shape may have, and the most simulations a search runs."""

    max_prefill: int = 64
    max_decode: int = 64
    simulations: int = 40


@dataclass(frozen=True, slots=True)
class Plan:
    """A search's answer: ``best`` is the cheapest shape that met the objectives (None: none
    did), ``smaller`` its next smaller shapes with their outcomes (None: not simulated, the
    search was cut), ``tried`` every simulation in the order run."""

    objectives: Objectives
    limits: Limits
    best: Outcome | None
    smaller: tuple[tuple[Shape, Outcome | None], ...]
    tried: tuple[Outcome, ...]
    cut: bool
