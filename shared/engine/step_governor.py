"""How many threads a step that runs op by op runs on, from how the last ones went. Pure: the
engine feeds it each step's wall and CPU seconds.

Every prompt step runs op by op, and so does every decode step where the fused decode call does
not load (a CPU without AVX-512, a model it does not cover). Such a step runs a few hundred
parallel regions (every projection, norm and attention of every layer), each ending when its
slowest thread does. When a process outside Crescent's core ledger (a build, a test runner,
another service) takes one of the cores, a thread that lost it finishes its share a scheduler
time slice later, at every region: a 48-token prompt was measured taking 2.5 to 6.6 s on two
threads that way, and 0.11 s on one; a prompt with 32 op-by-op decode steps 3.27x its idle time
on two threads, 1.32x governed (``bench/prompt_threads.py --decode 32``). The kernel says so
directly: the time the stepping thread spent runnable but waiting for a core (its run delay,
``/proc/thread-self/schedstat``), which is nil while the cores are its own. After a step that
waited more than ``MAX_DELAY_SHARE`` of its time, the next op-by-op steps run on one thread, for
a stretch that doubles each time sharing fails again and starts over once a shared step runs
clean (as the fused decode step's own governor does).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Of the step's wall time, the run delay above which its cores were being taken.
MAX_DELAY_SHARE = 0.1
#: Steps shorter than this say too little: a time slice alone is a few milliseconds.
MIN_WALL_S = 0.02
FIRST_STRETCH, LONGEST_STRETCH = 8, 256


@dataclass(slots=True)
class StepGovernor:
    """Owns the thread decision for op-by-op steps and its counts.

    Invariant: ``alone_left`` steps still run on one thread; ``stretch`` is what the next
    contended step sets it to, between ``FIRST_STRETCH`` and ``LONGEST_STRETCH``.
    """

    alone_left: int = 0
    stretch: int = FIRST_STRETCH
    steps: int = 0
    steps_alone: int = 0
    contended_steps: int = 0

    def threads(self, wanted: int) -> int:
        """The thread count of the next op-by-op step, when ``wanted`` are on offer."""
        self.steps += 1
        if wanted <= 1:
            return max(wanted, 1)
        if self.alone_left > 0:
            self.alone_left -= 1
            self.steps_alone += 1
            return 1
        return wanted

    def record(self, threads: int, wall_s: float, delayed_s: float) -> None:
        """What an op-by-op step on ``threads`` threads cost: its wall time and the time the
        stepping thread waited for a core meanwhile."""
        if threads <= 1 or wall_s < MIN_WALL_S:
            return
        if delayed_s > MAX_DELAY_SHARE * wall_s:
            self.alone_left = self.stretch
            self.stretch = min(2 * self.stretch, LONGEST_STRETCH)
            self.contended_steps += 1
        else:
            self.stretch = FIRST_STRETCH
