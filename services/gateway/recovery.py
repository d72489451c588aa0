"""When a choice's stream needs help: the gateway's decisions about one choice in flight.
Pure: no bus, no clock of its own; the run feeds it events and asks it what to do.

The gateway is the one place that knows exactly which tokens its client has, so it is the one
that recovers a request: it fills a gap in the stream from the node's record of it (replay),
and when the node serving it is gone, draining or silent, it resumes the request on another
node from the first token its client lacks (the scheduler places the resumed request where its
KV already is, so little is recomputed).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shared.messages import TokenChunk


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    """``gap_wait_s``: how long a hole in the stream may stay before the node is asked to
    replay it. ``probe_after_s``: silence after which the node is asked how the request is
    doing. ``stall_timeout_s``: silence after which the request fails even though its node
    says it runs. ``max_resumes``: how often one choice may move before it fails."""

    gap_wait_s: float = 0.3
    probe_after_s: float = 5.0
    stall_timeout_s: float = 120.0
    max_resumes: int = 4


class Act(enum.Enum):
    WAIT = "wait"
    REPLAY = "replay"  # ask the owner for the output from the first missing position
    RESUME = "resume"  # start the request again elsewhere, from the first missing position
    FAIL = "fail"  # give up: the client gets an error


@dataclass(slots=True)
class ChoiceWatch:
    """Owns what the gateway knows of where one choice runs and how it progresses.

    Invariant: ``owner`` is the node that last took the request (the scheduler's prefill
    node, then the decode node its owner notice names); chunks of a superseded attempt never
    reach here, since each attempt has its own request id.
    """

    owner: str
    owner_epoch: str
    progress_at: float
    owner_since: float = 0.0  # when the current owner was learnt
    attempt: int = 0
    resumes: int = 0
    gap_since: float | None = None
    asked_at: float | None = None  # a replay request is in flight since then
    probed_at: float = 0.0
    leaving: bool = False  # the owner said it gives the request up (a migrate chunk)
    noticed: bool = False  # an owner notice named the node serving this attempt
    reason: str = ""
    # Until then (or the next token) silence is expected: a first attempt's prefill is
    # bounded by the first-token timeout instead, a resumed one's by its predicted TTFT.
    # The stall timeout counts from here or from the last progress, whichever is later.
    quiet_until: float = 0.0

    def on_chunk(self, chunk: TokenChunk, advanced: bool, now: float) -> None:
        if chunk.owner:
            self.owner, self.owner_epoch = chunk.owner, chunk.owner_epoch
            self.owner_since = now
            self.noticed = True
        if chunk.migrate:
            self.leaving = True
        if advanced:
            self.progress_at = now
            self.gap_since = None
            self.quiet_until = 0.0  # tokens flow: silence counts again from now

    def restart(self, now: float) -> None:
        """A new attempt is being submitted: nothing is known yet of where it runs."""
        self.attempt += 1
        self.owner = self.owner_epoch = ""
        self.progress_at = now
        self.gap_since = None
        self.asked_at = None
        self.leaving = False
        self.noticed = False

    def accepted(self, owner: str, owner_epoch: str, now: float, quiet_for: float = 0.0) -> None:
        """The new attempt was accepted by prefill node ``owner``; its chunks may have come
        first and named a later owner already, which then stands. ``quiet_for``: how long
        its prefill may rightly stay silent (``quiet_until``)."""
        if not self.owner:
            self.owner, self.owner_epoch = owner, owner_epoch
            self.owner_since = now
        self.progress_at = max(self.progress_at, now)
        self.quiet_until = now + quiet_for

    def decide(self, now: float, owner_alive: bool, has_gap: bool, policy: RecoveryPolicy) -> Act:
        if self.asked_at is not None:
            return Act.WAIT  # the replay's answer (or its failure) decides
        if self.leaving or not owner_alive:
            self.reason = "its node left" if self.leaving else "its node died"
            return self._resume_or_fail(policy)
        if now - max(self.progress_at, self.quiet_until) >= policy.stall_timeout_s:
            self.reason = f"no token came for {policy.stall_timeout_s:g} s"
            return Act.FAIL
        if has_gap:
            self.gap_since = now if self.gap_since is None else self.gap_since
            if now - self.gap_since >= policy.gap_wait_s:
                return self._ask(now)
        silent = now - self.progress_at >= policy.probe_after_s
        if silent and now - self.probed_at >= policy.probe_after_s:
            return self._ask(now)
        return Act.WAIT

    def replay_failed(self, policy: RecoveryPolicy) -> Act:
        """The owner could not be reached, or no longer knows the request."""
        self.asked_at = None
        self.reason = "its node lost it"
        return self._resume_or_fail(policy)

    def replay_done(self) -> None:
        self.asked_at = None

    def _ask(self, now: float) -> Act:
        self.asked_at = now
        self.probed_at = now
        return Act.REPLAY

    def _resume_or_fail(self, policy: RecoveryPolicy) -> Act:
        if self.resumes >= policy.max_resumes:
            self.reason = f"{self.reason}, and it was moved {self.resumes} times already"
            return Act.FAIL
        self.resumes += 1
        return Act.RESUME
