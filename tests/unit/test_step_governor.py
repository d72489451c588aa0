"""The thread governor of op-by-op steps: one thread while cores are taken, back to all after."""

from __future__ import annotations

import torch

from shared.engine.step_governor import (
    FIRST_STRETCH,
    LONGEST_STRETCH,
    MAX_DELAY_SHARE,
    StepGovernor,
)
from shared.engine.step_threads import StepThreads


def contended(governor: StepGovernor, threads: int = 2) -> None:
    governor.record(threads, wall_s=1.0, delayed_s=2 * MAX_DELAY_SHARE)


def clean(governor: StepGovernor, threads: int = 2) -> None:
    governor.record(threads, wall_s=1.0, delayed_s=0.01)


def test_busy_threads_keep_every_thread() -> None:
    governor = StepGovernor()
    for _ in range(50):
        assert governor.threads(2) == 2
        clean(governor)
    assert governor.contended_steps == 0 and governor.steps_alone == 0


def test_a_step_that_lost_a_core_sends_the_next_ones_to_one_thread_for_a_stretch() -> None:
    governor = StepGovernor()
    assert governor.threads(2) == 2
    contended(governor)
    assert [governor.threads(2) for _ in range(FIRST_STRETCH)] == [1] * FIRST_STRETCH
    assert governor.threads(2) == 2  # then sharing is tried again
    assert governor.steps_alone == FIRST_STRETCH and governor.contended_steps == 1


def test_the_stretch_doubles_while_sharing_fails_and_starts_over_once_it_works() -> None:
    governor = StepGovernor()
    stretches = []
    for _ in range(8):
        contended(governor)  # the shared step (the first, or the one ending a stretch)
        alone = 0
        while governor.threads(2) == 1:
            alone += 1
        stretches.append(alone)
    assert stretches[:3] == [FIRST_STRETCH, 2 * FIRST_STRETCH, 4 * FIRST_STRETCH]
    assert max(stretches) == LONGEST_STRETCH
    clean(governor)
    contended(governor)
    assert governor.alone_left == FIRST_STRETCH


def test_one_thread_and_short_steps_teach_nothing() -> None:
    governor = StepGovernor()
    governor.record(1, wall_s=1.0, delayed_s=0.9)
    governor.record(2, wall_s=0.001, delayed_s=0.001)
    assert governor.threads(2) == 2 and governor.contended_steps == 0
    assert governor.threads(1) == 1


def test_only_op_by_op_steps_are_governed() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        threads = StepThreads()
        threads.begin(op_by_op=True)
        threads.end(1.0)
        contended(threads.governor)  # a core was taken during an op-by-op step
        threads.begin(op_by_op=False)  # a fused step keeps its team: its kernel governs itself
        assert torch.get_num_threads() == 2
        threads.end(0.05)
        threads.begin(op_by_op=True)
        assert torch.get_num_threads() == 1
        threads.end(0.05)
    finally:
        torch.set_num_threads(before)
