"""The record of one request: what the client measured, what the metrics read."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    """What one request did, times in seconds. ``sent_s`` counts from the start of the run;
    ``ttft_s`` and ``e2e_s`` from when it was sent. Usage figures are None where the server
    did not report them; ``output_tokens`` falls back to the count of text chunks."""

    index: int
    conversation: int
    turn: int
    scheduled_s: float
    sent_s: float
    prompt_len: int
    max_tokens: int
    ok: bool = False
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cached_by_tier: dict[str, int] | None = None
    response_id: str | None = None  # the server's id of its response, where it gives one
