"""How many threads each engine step runs on: the host core ledger's share, and one for steps
that run op by op while the governor sees another process taking cores
(``step_governor.py``)."""

from __future__ import annotations

from shared.engine.host_cores import HostCores
from shared.engine.step_governor import StepGovernor
from shared.engine.threads import run_delay_s, set_step_threads, step_threads


class StepThreads:
    """Owns the thread count of the engine's steps, the host's core ledger slot (``cores``,
    set by the loader where cores are shared) and the governor of op-by-op steps.

    Invariant: between ``begin`` and ``end`` torch computes on the count ``begin`` set; a
    count set from outside since the last step becomes the configured one (``max_threads``).
    """

    def __init__(self) -> None:
        self.cores: HostCores | None = None
        self.governor = StepGovernor()
        self.max_threads = self._set = step_threads()
        self._op_by_op = False
        self._delay_started = 0.0

    def begin(self, op_by_op: bool) -> None:
        """Marks a step starting (``op_by_op``: it runs op by op, not as one fused call: every
        prompt step, and decode steps where the fused call does not apply) and sets its
        thread count."""
        if step_threads() != self._set:
            self.max_threads = step_threads()
        wanted = self.cores.begin_step() if self.cores is not None else self.max_threads
        self._set = self.governor.threads(wanted) if op_by_op else wanted
        set_step_threads(self._set)
        self._op_by_op = op_by_op
        self._delay_started = run_delay_s()

    def end(self, wall_s: float) -> None:
        """The step took ``wall_s`` seconds."""
        if self.cores is not None:
            self.cores.end_step()
        if self._op_by_op:
            self.governor.record(self._set, wall_s, run_delay_s() - self._delay_started)

    def idle(self) -> None:
        """The last step left the engine nothing to compute."""
        if self.cores is not None:
            self.cores.idle()
