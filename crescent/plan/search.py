"""The search for the fewest prefill and decode nodes whose simulated replay of a workload meets
a TTFT and a TPOT objective for a required share of its requests.

A simulation is the expensive step (a second or more for a few thousand requests), so the
search spends them where they decide something. It leans on two properties of a
disaggregated cluster:

- TTFT depends mostly on the prefill nodes (a request's first token comes when its prefill
  ends) and TPOT on the decode nodes (their batch and their KV room). The requests that miss
  one objective point at one pool.
- Attainment, the share of requests meeting both, is close to monotone in each count:
  another node of either kind rarely makes it worse. So a shape that fails tells that every
  shape with no more nodes of either kind fails too.

The search, in four steps:

1. Bracket: from one node of each kind, double the pool whose misses alone exceed the share
   allowed to miss (both pools when neither does alone) until a shape meets the objectives.
   When neither pool can grow within its cap, no shape within the caps meets them.
2. Shrink: bisect the prefill count down at that decode count, then the decode count at the
   prefill count found. Known failures bound each bisection from below.
3. Settle: simulate both next smaller shapes (one prefill node fewer, one decode node fewer).
   If one meets after all (attainment is only nearly monotone), move there and shrink again.
   The answer's two smaller neighbours are simulated failures, not inferred ones.
4. Trade: a cheaper shape can still lie off this corner, with more nodes of one kind and
   fewer of the other. Walk each way along the shapes of one node fewer in all; stop where the
   pool being cut is known to miss too much alone (a shape simulated with as many of its
   nodes and no more of the other kind did: more of the other kind cannot help it), and
   shrink from any shape that meets.

Each shape is simulated once at most, and never more than ``Limits.simulations`` in all: a
search cut short answers with the cheapest shape that met so far, and says it was cut.
Pure: the caller passes the function that simulates one shape.
"""

from __future__ import annotations

from collections.abc import Callable
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


Simulate = Callable[[Shape], Outcome]


class _Spent(Exception):
    """The search used up its simulations."""


class Search:
    """Owns one search's simulations. Invariant: each shape is simulated at most once, and
    at most ``limits.simulations`` shapes in all."""

    def __init__(self, simulate: Simulate, objectives: Objectives, limits: Limits) -> None:
        self.simulate = simulate
        self.objectives = objectives
        self.limits = limits
        self.outcomes: dict[Shape, Outcome] = {}
        self.settled: set[Shape] = set()  # meeting shapes whose smaller neighbours fail

    def run(self) -> Plan:
        cut = False
        try:
            self._search()
        except _Spent:
            cut = True
        best = self._best()
        smaller = () if best is None else best.shape.smaller()
        return Plan(
            objectives=self.objectives,
            limits=self.limits,
            best=best,
            smaller=tuple((s, self.outcomes.get(s)) for s in smaller),
            tried=tuple(self.outcomes.values()),
            cut=cut,
        )

    def meets(self, outcome: Outcome) -> bool:
        return outcome.attainment >= self.objectives.attainment

    def outcome(self, shape: Shape) -> Outcome:
        known = self.outcomes.get(shape)
        if known is not None:
            return known
        if len(self.outcomes) >= self.limits.simulations:
            raise _Spent
        found = self.outcomes[shape] = self.simulate(shape)
        return found

    def _best(self) -> Outcome | None:
        """The meeting shape with the fewest nodes; at equal count a settled one first (a
        search cut short may not have settled its cheapest), then the higher attainment."""
        meeting = [o for o in self.outcomes.values() if self.meets(o)]
        return min(
            meeting,
            key=lambda o: (o.shape.nodes, o.shape not in self.settled, -o.attainment),
            default=None,
        )

    def _search(self) -> None:
        start = self._bracket()
        if start is None:
            return
        best = self._settle(self._shrink(start))
        while (cheaper := self._trade(best)) is not None:
            best = self._settle(self._shrink(cheaper))

    def _bracket(self) -> Shape | None:
        shape, limits, too_many = Shape(1, 1), self.limits, self.objectives.too_many
        while True:
            found = self.outcome(shape)
            if self.meets(found):
                return shape
            grow_prefill = too_many(found.ttft_missed) and shape.prefill < limits.max_prefill
            grow_decode = too_many(found.tpot_missed) and shape.decode < limits.max_decode
            if not (grow_prefill or grow_decode):
                # Neither pool alone, or the one that needs it is at its cap: grow what can.
                grow_prefill = grow_decode = True
            bigger = Shape(
                min(shape.prefill * (2 if grow_prefill else 1), limits.max_prefill),
                min(shape.decode * (2 if grow_decode else 1), limits.max_decode),
            )
            if bigger == shape:
                return None
            shape = bigger

    def _shrink(self, shape: Shape) -> Shape:
        """The least prefill count that meets at ``shape``'s decode count, then the least
        decode count at that prefill count (``shape`` meets)."""
        shape = self._least(shape, prefill=True)
        return self._least(shape, prefill=False)

    def _least(self, meeting: Shape, prefill: bool) -> Shape:
        """Bisects one count of ``meeting`` down, the other held, from the most nodes a known
        failure had there: a failure with more of the held kind is one with as many."""
        high = _count(meeting, prefill)
        low = max(
            (_count(s, prefill) for s, o in self.outcomes.items()
             if not self.meets(o) and _count(s, not prefill) >= _count(meeting, not prefill)
             and _count(s, prefill) < high),
            default=0,
        )  # fmt: skip
        while high - low > 1:
            middle = (low + high) // 2
            if self.meets(self.outcome(_with(meeting, prefill, middle))):
                high = middle
            else:
                low = middle
        return _with(meeting, prefill, high)

    def _settle(self, shape: Shape) -> Shape:
        while True:
            fewer = [s for s in shape.smaller() if self.meets(self.outcome(s))]
            if not fewer:
                self.settled.add(shape)
                return shape
            shape = self._shrink(fewer[0])

    def _trade(self, best: Shape) -> Shape | None:
        """A meeting shape with one node fewer than ``best`` in all, more of one kind and
        fewer of the other; None if the walks find none."""
        for more_prefill in (True, False):
            for step in range(1, best.nodes):
                shape = _traded(best, step, more_prefill)
                if shape is None or not self._within(shape) or self._hopeless(shape, more_prefill):
                    break
                if any(s.covers(shape) for s, o in self.outcomes.items() if not self.meets(o)):
                    continue  # a failure with as many of both: this one fails too
                if self.meets(self.outcome(shape)):
                    return shape
        return None

    def _hopeless(self, shape: Shape, cut_decode: bool) -> bool:
        """Whether the pool cut in ``shape`` already missed too much alone in a simulated shape
        with as many of its nodes and no more of the other kind: more of the other kind does
        not lower those misses (the more prefill nodes, the more load reaches decode)."""
        too_many, cut_prefill = self.objectives.too_many, not cut_decode
        return any(
            _count(s, cut_prefill) >= _count(shape, cut_prefill)
            and _count(s, not cut_prefill) <= _count(shape, not cut_prefill)
            and too_many(o.tpot_missed if cut_decode else o.ttft_missed)
            for s, o in self.outcomes.items()
        )

    def _within(self, shape: Shape) -> bool:
        return shape.prefill <= self.limits.max_prefill and shape.decode <= self.limits.max_decode


def _traded(best: Shape, step: int, more_prefill: bool) -> Shape | None:
    """``step`` more nodes of one kind than ``best`` and ``step + 1`` fewer of the other."""
    if more_prefill:
        shape = Shape(best.prefill + step, best.decode - step - 1)
    else:
        shape = Shape(best.prefill - step - 1, best.decode + step)
    return shape if shape.prefill >= 1 and shape.decode >= 1 else None


def _count(shape: Shape, prefill: bool) -> int:
    return shape.prefill if prefill else shape.decode


def _with(shape: Shape, prefill: bool, count: int) -> Shape:
    """``shape`` with its prefill (or decode) count set to ``count``."""
    return Shape(count, shape.decode) if prefill else Shape(shape.prefill, count)


def plan(simulate: Simulate, objectives: Objectives, limits: Limits | None = None) -> Plan:
    """The cheapest shape meeting ``objectives``, searched as the module says."""
    return Search(simulate, objectives, limits or Limits()).run()
