"""The services' lifecycle helper: periodic ticks keep their schedule through failures, a
long-running task is restarted, a FATAL failure stops the service and its steps run in reverse
order, one-shot failures are counted and logged, and ``stop`` leaves nothing running."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from prometheus_client import CollectorRegistry

from shared import task_policy
from shared.background import Background
from shared.lifecycle import Lifecycle, OnError, TaskFailed

T = TypeVar("T")
TICK_S = 0.01
#: A bound on every wait for an event the helper should cause, far above a tick.
WAIT_S = 5.0


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(WAIT_S * 2):
            return await scenario()

    return asyncio.run(bounded())


async def reached(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), WAIT_S)


def others() -> set[asyncio.Task[object]]:
    return asyncio.all_tasks() - {asyncio.current_task()}


class Calls:
    """Counts the calls of a task's body; ``reached`` is set at the ``at``-th."""

    def __init__(self, at: int) -> None:
        self.count = 0
        self.at = at
        self.reached = asyncio.Event()

    def __call__(self) -> int:
        self.count += 1
        if self.count == self.at:
            self.reached.set()
        return self.count


def test_a_tick_that_raises_is_counted_and_the_schedule_goes_on() -> None:
    async def scenario() -> tuple[int, int]:
        life = Lifecycle("svc")
        ticks = Calls(at=5)

        async def tick() -> None:
            if ticks() % 2 == 1:
                raise ValueError("odd tick")

        life.every("odd", TICK_S, tick)
        await life.start()
        await reached(ticks.reached)
        await life.stop()
        return ticks.count, life.failures["odd"]

    ticks, failures = run(scenario)
    assert ticks >= 5
    assert failures == (ticks + 1) // 2


def test_an_interval_read_from_a_callable_and_a_first_tick_only_after_it() -> None:
    async def scenario() -> list[float]:
        life = Lifecycle("svc")
        asked: list[float] = []
        ticked = asyncio.Event()

        def interval() -> float:
            asked.append(TICK_S)
            return TICK_S

        async def tick() -> None:
            ticked.set()

        life.every("later", interval, tick, immediately=False)
        await life.start()
        await reached(ticked)
        await life.stop()
        return asked

    assert len(run(scenario)) >= 2  # once before the first tick, once after it


def test_a_long_running_task_is_restarted_after_it_fails_or_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(task_policy, "RESTART_MIN_S", 0.0)

    async def scenario() -> tuple[int, int]:
        life = Lifecycle("svc")
        runs = Calls(at=3)

        async def work() -> None:
            nth = runs()
            if nth == 1:
                raise ConnectionError("dropped")
            if nth == 3:
                await asyncio.Event().wait()  # runs until cancelled

        life.run("receive", work)
        await life.start()
        await reached(runs.reached)
        await life.stop()
        return runs.count, life.failures["receive"]

    assert run(scenario) == (3, 2)


def test_a_fatal_failure_stops_the_service_and_runs_its_steps_in_reverse() -> None:
    async def scenario() -> None:
        life = Lifecycle("svc")
        order: list[str] = []
        sibling_cancelled = asyncio.Event()

        async def sibling() -> None:
            try:
                await asyncio.Event().wait()
            finally:
                sibling_cancelled.set()

        async def fatal() -> None:
            raise KeyError("lost")

        async def close_bus() -> None:
            order.append("bus")

        def failing() -> None:
            order.append("failing")
            raise OSError("step failed")

        life.on_stop("bus", close_bus)
        life.on_stop("failing", failing)
        life.on_stop("ops", lambda: order.append("ops"))
        life.run("sibling", sibling)
        await life.start()
        life.run("fatal", fatal, on_error=OnError.FATAL)  # after start: starts at once
        with pytest.raises(TaskFailed) as failed:
            await life.wait()
        assert isinstance(failed.value.__cause__, KeyError)
        assert sibling_cancelled.is_set()
        assert order == ["ops", "failing", "bus"]
        assert life.failures["fatal"] == 1
        await life.stop()  # idempotent: nothing runs twice
        assert order == ["ops", "failing", "bus"]

    run(scenario)


def test_a_spawned_failure_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> Lifecycle:
        life = Lifecycle("svc")
        await life.start()

        async def hand_off() -> None:
            raise RuntimeError("peer gone")

        task = life.spawn(hand_off(), "hand-off")
        await asyncio.wait({task})
        await life.stop()
        return life

    with caplog.at_level(logging.ERROR, logger="shared.lifecycle"):
        life = run(scenario)
    assert life.failures["hand-off"] == 1
    assert any("hand-off" in r.getMessage() and r.exc_info for r in caplog.records)


def test_stop_leaves_no_task_running_and_can_be_called_again() -> None:
    async def scenario() -> None:
        life = Lifecycle("svc")
        steps: list[str] = []
        life.every("beat", TICK_S, asyncio.sleep, immediately=False)  # type: ignore[arg-type]
        life.run("loop", asyncio.Event().wait)  # type: ignore[arg-type]
        life.on_stop("close", lambda: steps.append("close"))
        await life.start()
        life.spawn(asyncio.Event().wait(), "waiting")
        await asyncio.gather(life.stop(), life.stop())
        await life.stop()
        assert others() == set()
        assert steps == ["close"]
        with pytest.raises(RuntimeError):
            life.every("late", TICK_S, asyncio.sleep)  # type: ignore[arg-type]

    run(scenario)


def test_the_metric_counts_failures_by_service_and_task() -> None:
    registry = CollectorRegistry()

    async def scenario() -> None:
        life = Lifecycle("tierd", registry)
        failed_twice = asyncio.Event()

        async def tick() -> None:
            if life.failures["sweep"] == 1:
                failed_twice.set()
            raise ValueError("database away")

        life.every("sweep", TICK_S, tick)
        await life.start()
        await reached(failed_twice)
        await life.stop()
        assert (
            registry.get_sample_value(
                "crescent_task_failures_total", {"service": "tierd", "task": "sweep"}
            )
            == life.failures["sweep"]
        )

    run(scenario)


def test_background_logs_and_counts_what_fails(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> Background:
        work = Background()

        async def fails() -> None:
            raise ValueError("lost hand-off")

        work.spawn(fails())
        work.spawn(asyncio.Event().wait())
        await asyncio.sleep(0)
        assert len(work) >= 1
        await work.close()
        assert len(work) == 0 and others() == set()
        return work

    with caplog.at_level(logging.ERROR, logger="shared.lifecycle"):
        work = run(scenario)
    assert sum(work.failures.values()) == 1
    assert any(r.exc_info for r in caplog.records)
