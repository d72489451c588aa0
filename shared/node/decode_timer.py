"""What a decode node times of one request it serves (``shared.phases``)."""

from __future__ import annotations

from dataclasses import dataclass

from shared import phases


@dataclass(slots=True)
class DecodeTimer:
    """Owns the times of one request on a decode node, on its monotonic clock: when the
    hand-off arrived, when its KV was in the pool, and its outputs and their publishing.
    Invariant: ``outputs`` counts the calls to ``output``; ``published`` follows each."""

    received_at: float
    running_at: float = 0.0
    first_at: float = 0.0
    last_at: float = 0.0
    outputs: int = 0
    publish_s: float = 0.0
    published: int = 0
    compute_s: float = 0.0  # the engine steps behind the outputs after the first

    def output(self, now: float, step_s: float = 0.0) -> dict[str, float]:
        """Counts one output, which an engine step of ``step_s`` made; the phases its chunk
        should carry (the hand-off and the first step on the first, none after)."""
        self.outputs += 1
        self.last_at = now
        if self.outputs > 1:
            self.compute_s += step_s
            return {}
        self.first_at = now
        running = self.running_at or now
        return {
            phases.KV_HANDOFF: max(running - self.received_at, 0.0),
            phases.FIRST_DECODE_STEP: max(now - running, 0.0),
        }

    def sent(self, seconds: float) -> None:
        self.publish_s += seconds
        self.published += 1

    def totals(self) -> dict[str, float]:
        """The per-token means so far, for the last chunk: time between outputs, the engine's
        step behind each, and the time one took to publish."""
        out = {}
        if self.outputs > 1:
            out[phases.DECODE_STEP] = (self.last_at - self.first_at) / (self.outputs - 1)
            out[phases.ENGINE_STEP] = self.compute_s / (self.outputs - 1)
        if self.published:
            out[phases.TOKEN_PUBLISH] = self.publish_s / self.published
        return out
