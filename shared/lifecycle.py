"""How every service runs its background work: named periodic and long-running tasks under one
``asyncio.TaskGroup``, one-shot hand-offs that are tracked until they end, an error policy per
task, a failure count per task name, and an ordered stop.

This module is the only place in the services that starts asyncio tasks; what a named task does
between its runs is ``shared.task_policy``.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import prometheus_client

from shared.task_policy import Interval, OnError, TaskFailed, Tick, Work, long_running, periodic

log = logging.getLogger(__name__)
T = TypeVar("T")
#: The longest one stop step may take before the next one runs.
STOP_STEP_S = 10.0
StopStep = Callable[[], Awaitable[None] | None]


def awaited_task(work: Awaitable[T], name: str = "") -> asyncio.Task[T]:
    """A task its creator awaits itself (to race it against another, or to bound it without
    cancelling it): its result and its failure go to that creator, so nothing is logged here."""
    task = asyncio.ensure_future(work)
    if name:
        task.set_name(name)
    return task


class Tasks:
    """Owns one-shot tasks. Invariant: a task is held from ``spawn`` until it ends (so none is
    garbage-collected half-way); one nobody awaits that fails is logged and counted under its
    name, never lost (an ``awaited`` one's failure goes to its caller); ``close`` leaves none
    running."""

    def __init__(self, owner: str = "", on_failure: Callable[[str], None] | None = None) -> None:
        self.owner = owner
        self.failures: collections.Counter[str] = collections.Counter()
        self._on_failure = on_failure
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(
        self, work: Coroutine[Any, Any, T], name: str = "", *, awaited: bool = False
    ) -> asyncio.Task[T]:
        """Starts ``work``. ``awaited``: its caller awaits it and takes its failure, so the
        task is only held here (and covered by ``wait`` and ``close``)."""
        task = asyncio.get_running_loop().create_task(work, name=name or _name_of(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_retrieve if awaited else self._report)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    async def wait(self) -> None:
        """Lets every task started so far end on its own."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def close(self) -> None:
        """Cancels what still runs and waits for it to be gone."""
        self.cancel()
        await self.wait()

    def _report(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        name = task.get_name()
        self.failures[name] += 1
        if self._on_failure is not None:
            self._on_failure(name)
        where = f"{self.owner}: " if self.owner else ""
        log.error("%stask %s failed", where, name, exc_info=task.exception())


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved so that an abandoned caller leaves no warning


def _name_of(work: Coroutine[Any, Any, Any]) -> str:
    return getattr(work, "__qualname__", "") or type(work).__name__


class Lifecycle:
    """One service's tasks: named periodic and long-running ones run under a TaskGroup from
    ``start`` to ``stop``, one-shot ones in a tracker, and the steps that stop the service.

    Invariants: a task's failure is logged and counted in ``failures`` (and in
    ``crescent_task_failures_total`` when a registry was given) under the task's name, then
    handled per its ``OnError``; after ``stop`` no task of it runs and every stop step has run
    once, in reverse order of registration, whatever the others did.
    """

    def __init__(
        self,
        service: str,
        registry: prometheus_client.CollectorRegistry | None = None,
    ) -> None:
        self.service = service
        self.failures: collections.Counter[str] = collections.Counter()
        self._metric = None
        if registry is not None:
            self._metric = prometheus_client.Counter(
                "crescent_task_failures",
                "Failures of a service's background tasks, by task name.",
                ["service", "task"],
                registry=registry,
            )
        self._oneshots = Tasks(service, self._count)
        self._bodies: list[tuple[str, Callable[[], Coroutine[Any, Any, None]]]] = []
        self._steps: list[tuple[str, StopStep]] = []
        self._group: asyncio.TaskGroup | None = None
        self._host: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._stopped = False
        self._error: BaseException | None = None

    # -- registering --------------------------------------------------------------------

    def every(
        self,
        name: str,
        interval_s: Interval,
        tick: Tick,
        *,
        on_error: OnError = OnError.LOG,
        immediately: bool = True,
    ) -> None:
        """A named periodic task: ``tick()`` every interval (measured start to start, read
        again before each wait when it is a callable); a tick that raises is logged and counted
        and, unless ``on_error`` is FATAL, the schedule goes on; cancellation ends it."""
        self._add(
            name, lambda: periodic(name, interval_s, tick, on_error, immediately, self._failed)
        )

    def run(
        self,
        name: str,
        work: Work,
        *,
        on_error: OnError = OnError.RESTART,
    ) -> None:
        """A named long-running task (a receive loop); if it returns or raises, that is logged
        and counted, then it is run again (RESTART), the service stopped (FATAL) or left ended
        (LOG)."""
        self._add(name, lambda: long_running(name, work, on_error, self._failed))

    def spawn(self, work: Coroutine[Any, Any, T], name: str = "") -> asyncio.Task[T]:
        """One-shot work nobody waits for (a hand-off): tracked until it ends; a failure is
        logged and counted, never lost; ``stop`` cancels it."""
        return self._oneshots.spawn(work, name)

    def on_stop(self, name: str, step: StopStep) -> None:
        """A shutdown step, run by ``stop`` after the tasks are gone: steps run in reverse order
        of registration, each bounded by ``STOP_STEP_S``; one failing does not skip the rest."""
        self._steps.append((name, step))

    # -- running ------------------------------------------------------------------------

    async def start(self) -> None:
        """Starts the tasks registered so far; those registered later start at once."""
        if self._host is not None or self._stopped:
            raise RuntimeError(f"{self.service}'s lifecycle was already started")
        ready = asyncio.get_running_loop().create_future()
        self._host = asyncio.get_running_loop().create_task(
            self._hold(ready), name=f"{self.service}-lifecycle"
        )
        await ready

    async def wait(self) -> None:
        """Returns once the service has stopped; raises ``TaskFailed`` if a FATAL task's
        failure stopped it."""
        if self._host is not None:
            await asyncio.shield(self._host)
        if self._error is not None:
            raise TaskFailed(f"{self.service} stopped: a task failed") from self._error

    async def stop(self) -> None:
        """Cancels the tasks and waits for them, then runs the stop steps; idempotent."""
        self._stopping.set()
        if self._host is not None:
            # Shielded: a caller cancelled half-way must not cancel the stop itself.
            await asyncio.shield(self._host)
        elif not self._stopped:
            self._stopped = True
            await self._run_steps()

    @property
    def running(self) -> bool:
        """Between ``start`` and ``stop`` (or a FATAL failure)."""
        return self._group is not None

    def _add(self, name: str, body: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if self._stopped:
            raise RuntimeError(f"{self.service} is stopped; cannot add task {name}")
        if self._group is not None:
            self._group.create_task(body(), name=name)
        else:
            self._bodies.append((name, body))

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                for name, body in self._bodies:
                    group.create_task(body(), name=name)
                ready.set_result(None)
                await self._stopping.wait()
                # Stopping: the group's own tasks are cancelled by leaving it with an error.
                raise _Stopping
        except* _Stopping:
            pass
        except* TaskFailed as failed:
            self._error = failed.exceptions[0].__cause__
        finally:
            self._group = None
            self._stopped = True
            if not ready.done():
                ready.set_result(None)
            await self._oneshots.close()
            await self._run_steps()

    async def _run_steps(self) -> None:
        for name, step in reversed(self._steps):
            try:
                async with asyncio.timeout(STOP_STEP_S):
                    result = step()
                    if inspect.isawaitable(result):
                        await result
            except Exception:
                log.exception("%s: stop step %s failed", self.service, name)

    def _failed(self, name: str, exc: Exception, streak: int, on_error: OnError) -> None:
        self._count(name)
        if streak == 1 or on_error is OnError.FATAL:
            log.error("%s: task %s failed", self.service, name, exc_info=exc)
        else:  # the traceback was logged when this run of failures began
            log.warning(
                "%s: task %s failed again (%d in a row): %r", self.service, name, streak, exc
            )
        if on_error is OnError.FATAL:
            raise TaskFailed(name) from exc

    def _count(self, name: str) -> None:
        self.failures[name] += 1
        if self._metric is not None:
            self._metric.labels(self.service, name).inc()


class _Stopping(Exception):
    """Leaves the TaskGroup, which cancels its tasks and waits for them."""
