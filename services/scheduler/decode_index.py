"""Decode nodes kept by lower bounds of the time between tokens they can be predicted to have,
so ranking them forecasts only the few that can make the first places.

``forecast.forecast`` predicts a node at ``at`` from its heartbeat: every sequence it reported
as finishing within the steps it takes by then leaves, the request and every placed arrival
join. Two bounds hold for a node of ``r`` running sequences holding ``u`` tokens of blocks,
for a request of ``p`` prompt tokens, with ``f`` the role's shared step-time model:

- *strong*: while no reported sequence can have finished (``at`` before ``due``, the heartbeat
  plus the fewest tokens any has left times the fastest step it can take), the batch is at least
  ``r + 1`` and the context at least ``u + p``, so the step takes at least ``f(r + 1, u + p)``;
- *weak*, at any time: at most the reported sequences leave, so at least ``f(r + 1 - k, u - c +
  p)``, ``k`` of them holding ``c`` context tokens.

A node is kept under its strong bound until the latest ``at`` asked for passes its ``due``, and
under its weak bound from then on (until its next heartbeat). Within a group of equal least
batch, the bound grows with the token count, which orders the group. Pure: no I/O.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.scheduler.index import Entry, insert, remove
from services.scheduler.timing import StepCoefficients, decode_step_seconds

if TYPE_CHECKING:
    from services.scheduler.cluster import NodeLoad

#: A group of decode nodes: (block size, least batch when the request joins).
Group = tuple[int, int]
#: A margin on ``due`` far above rounding and far below a step: a bound never lapses late.
_DUE_MARGIN = 1e-9


@dataclass(slots=True)
class _Kept:
    """Where one node is kept: its strong and weak groups and entries; ``stamp`` tells its
    pending ``due`` from an outdated one."""

    strong: tuple[Group, Entry]
    weak: tuple[Group, Entry]
    is_weak: bool
    stamp: int


@dataclass(slots=True)
class DecodeIndex:
    """Owns the decode nodes by bound, for the shared step-time model of ``version``.

    Invariants: every decode node of the view is in ``odd`` (it reported more finishing
    sequences than it runs: forecast one by one) or in exactly one entry of ``strong`` or
    ``weak``; a node is in ``strong`` only while its ``due`` is after ``watermark``, and then
    ``due`` holds it with its current stamp.
    """

    version: int = -1
    coef: StepCoefficients | None = None
    strong: dict[Group, list[Entry]] = field(default_factory=dict)
    weak: dict[Group, list[Entry]] = field(default_factory=dict)
    odd: set[str] = field(default_factory=set)
    due: list[tuple[float, int, str]] = field(default_factory=list)
    watermark: float = -math.inf
    kept: dict[str, _Kept] = field(default_factory=dict)
    _stamps: int = 0

    def put(self, node: NodeLoad) -> None:
        assert self.coef is not None
        self.remove(node.node_id)
        running, finishing, bs = node.running_seqs, node.finishing, node.block_size
        if len(finishing) > running:
            self.odd.add(node.node_id)
            return
        used = max(node.total_blocks - node.free_blocks, 0) * bs
        leaving = sum(context for _, context in finishing)
        strong = ((bs, running + 1), (used, node.node_id))
        weak = ((bs, running + 1 - len(finishing)), (used - leaving, node.node_id))
        due = math.inf
        if finishing:
            fastest = decode_step_seconds(self.coef, running + 1, used)
            due = node.last_seen + finishing[0][0] * fastest * (1 - _DUE_MARGIN)
            if fastest <= 0:
                due = -math.inf
        self._stamps += 1
        kept = _Kept(strong, weak, due <= self.watermark, self._stamps)
        self.kept[node.node_id] = kept
        group, entry = weak if kept.is_weak else strong
        insert((self.weak if kept.is_weak else self.strong).setdefault(group, []), entry)
        if not kept.is_weak and due < math.inf:
            heapq.heappush(self.due, (due, kept.stamp, node.node_id))

    def remove(self, node_id: str) -> None:
        self.odd.discard(node_id)
        kept = self.kept.pop(node_id, None)
        if kept is not None:
            self._take(kept)

    def _take(self, kept: _Kept) -> None:
        groups = self.weak if kept.is_weak else self.strong
        group, entry = kept.weak if kept.is_weak else kept.strong
        entries = groups[group]
        remove(entries, entry)
        if not entries:
            del groups[group]

    def advance(self, at: float) -> None:
        """Moves every node whose strong bound may lapse by ``at`` to its weak bound."""
        if at <= self.watermark:
            return
        self.watermark = at
        while self.due and self.due[0][0] <= at:
            _, stamp, node_id = heapq.heappop(self.due)
            kept = self.kept.get(node_id)
            if kept is None or kept.stamp != stamp or kept.is_weak:
                continue
            self._take(kept)
            kept.is_weak = True
            group, entry = kept.weak
            insert(self.weak.setdefault(group, []), entry)
