"""Where one request's time went: the phases the gateway timed, the ones the nodes sent with
their chunks (``shared.phases``), and what is left over; and the last requests' breakdowns,
for the debug view. Pure: no I/O."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared import phases

#: Breakdowns kept for the debug view, the most recent ones.
MAX_RECENT = 1024


@dataclass(slots=True)
class RequestPhases:
    """Owns the phase durations of one API request, as seen by its first choice (the other
    choices run the same path at the same time). Invariant: each phase holds the first value
    any chunk gave it, except the per-token means, which the last chunk gives."""

    timed: dict[str, float] = field(default_factory=dict)
    sse_s: float = 0.0
    sse_events: int = 0

    def gateway(self, phase: str, seconds: float) -> None:
        self.timed[phase] = max(seconds, 0.0)

    def from_node(self, sent: Mapping[str, float]) -> None:
        for phase, seconds in sent.items():
            if phase not in phases.NODE_PHASES:
                continue  # a newer node's phase this gateway does not know
            if phase in phases.PER_TOKEN_PHASES or phase not in self.timed:
                self.timed[phase] = seconds

    def wrote_event(self, seconds: float) -> None:
        self.sse_s += seconds
        self.sse_events += 1

    def breakdown(self, ttft_s: float | None, inter_token_s: float | None) -> dict[str, float]:
        """Every phase known of the request, in seconds. ``ttft_s`` is its time to first token
        from the HTTP request's arrival; ``inter_token_s`` the mean gap between its tokens as
        the gateway received them."""
        out = {p: self.timed[p] for p in phases.ALL_PHASES if p in self.timed}
        if ttft_s is not None:
            out[phases.HOPS] = phases.first_token_hops(self.timed, ttft_s)
        if inter_token_s is not None:
            out[phases.INTER_TOKEN] = inter_token_s
        if self.sse_events:
            out[phases.SSE_WRITE] = self.sse_s / self.sse_events
        return out


@dataclass(slots=True)
class Recent:
    """The breakdowns of the last ``limit`` requests, by response id, with the tenant that
    made each (only that tenant may read it). Invariant: at most ``limit`` entries, the
    oldest dropped first."""

    limit: int = MAX_RECENT
    entries: OrderedDict[str, tuple[str, dict[str, Any]]] = field(default_factory=OrderedDict)

    def add(self, request_id: str, tenant: str, view: dict[str, Any]) -> None:
        self.entries[request_id] = (tenant, view)
        self.entries.move_to_end(request_id)
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)

    def get(self, request_id: str, tenant: str) -> dict[str, Any] | None:
        found = self.entries.get(request_id)
        if found is None or found[0] != tenant:
            return None
        return found[1]
