"""Requests placed whose prefill has not ended yet: the load a decode node's own heartbeat cannot
show, because the sequences have not reached it.

Mooncake (Qin et al., FAST 2025, §7) shows that admission on the decode load at the time of the
request swings: a burst admitted while decode looks idle lands there a prefill later. The
scheduler knows every request it placed and when its prefill should end (placement time plus
predicted TTFT), so it can count them where and when they will land. Pure: no I/O.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, eq=False)
class InFlight:
    """One placed request between its placement and its arrival at its decode node. Compared
    by identity: two placements are never the same one, whatever their fields."""

    request_id: str  # "" when the caller gave none: counted, but cannot be withdrawn
    prefill_node: str
    prefill_tokens: int  # tokens its prefill node computes for it
    decode_node: str
    placed_at: float
    arrives_at: float  # placement time plus predicted TTFT
    blocks: int  # blocks it will need on the decode node (prompt and max_tokens)
    context_tokens: int  # tokens in its KV when it arrives (the prompt)


@dataclass(slots=True)
class Arrivals:
    """The requests on their way to one decode node, by predicted arrival.

    Invariant: ``entries`` are sorted by ``arrives_at``; ``seqs``, ``blocks`` and ``tokens`` are
    their count and the sums of their blocks and context tokens.
    """

    entries: list[InFlight] = field(default_factory=list)
    seqs: int = 0
    blocks: int = 0
    tokens: int = 0

    def add(self, entry: InFlight) -> None:
        bisect.insort(self.entries, entry, key=_arrival)
        self._count(entry, +1)

    def remove(self, entry: InFlight) -> None:
        self.entries.remove(entry)
        self._count(entry, -1)

    def drop_until(self, t: float) -> list[InFlight]:
        """Forgets the requests predicted to have arrived by ``t`` (a heartbeat taken then
        counts them itself); returns them."""
        cut = bisect.bisect_right(self.entries, t, key=_arrival)
        dropped, self.entries = self.entries[:cut], self.entries[cut:]
        for entry in dropped:
            self._count(entry, -1)
        return dropped

    def by(self, t: float) -> tuple[int, int]:
        """Sequences, and their context tokens, arrived by ``t``. Walks only the entries due
        after ``t``, which are few: requests placed later mostly land later."""
        seqs, tokens = self.seqs, self.tokens
        for entry in reversed(self.entries):
            if entry.arrives_at <= t:
                break
            seqs -= 1
            tokens -= entry.context_tokens
        return seqs, tokens

    def _count(self, entry: InFlight, sign: int) -> None:
        self.seqs += sign
        self.blocks += sign * entry.blocks
        self.tokens += sign * entry.context_tokens


def _arrival(entry: InFlight) -> float:
    return entry.arrives_at
