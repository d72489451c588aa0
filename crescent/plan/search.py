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
   No shape meets them when a pool at its cap still misses too much alone.
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

from crescent.plan.shapes import Limits, Objectives, Outcome, Plan, Shape

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
        shape, limits = Shape(1, 1), self.limits
        too_many = self.objectives.too_many
        while True:
            found = self.outcome(shape)
            if self.meets(found):
                return shape
            if self._stuck(found):
                return None
            grow_prefill = too_many(found.ttft_missed)
            grow_decode = too_many(found.tpot_missed)
            if not (grow_prefill or grow_decode):
                grow_prefill = grow_decode = True
            bigger = Shape(
                min(shape.prefill * (2 if grow_prefill else 1), limits.max_prefill),
                min(shape.decode * (2 if grow_decode else 1), limits.max_decode),
            )
            if bigger == shape:
                return None
            shape = bigger

    def _stuck(self, found: Outcome) -> bool:
        """Whether a pool at its cap still misses too much alone: more of the other kind
        cannot help it (TTFT hardly depends on decode nodes, and more prefill nodes only send
        decode more load)."""
        too_many, limits, shape = self.objectives.too_many, self.limits, found.shape
        return (too_many(found.ttft_missed) and shape.prefill >= limits.max_prefill) or (
            too_many(found.tpot_missed) and shape.decode >= limits.max_decode
        )

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
