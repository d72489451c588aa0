"""The engine's step loop, run on the engine's own thread: steps back to back, changes to the
engine's requests between two of them, outputs handed to the event loop as they come."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from shared.engine.types import RequestOutput

log = logging.getLogger(__name__)
T = TypeVar("T")
#: After this many steps in a row raise, the engine's requests are failed instead of retried.
MAX_FAILED_STEPS = 3
#: How long the loop sleeps after a step raised, before it tries again.
FAILED_STEP_PAUSE_S = 0.05


class SteppedEngine(Protocol):
    """What the loop needs of the engine (``LLMEngine``, which only the host names)."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> list[RequestOutput]: ...

    def fail_all(self, error: str) -> list[RequestOutput]: ...


class StepLoop:
    """Owns the engine thread while the node runs: the queue of changes waiting for the gap
    between two steps, and the step loop itself.

    The thread never waits for the event loop: it runs the queued changes, steps while the
    engine has work, and hands each step's outputs to ``deliver`` (which must only enqueue
    them), so a node's steps follow each other with no hop in between. Invariant: while the
    loop runs, this thread alone changes requests or steps the engine; ``stop`` runs the
    changes still queued, so no caller is left waiting.
    """

    def __init__(
        self,
        engine: SteppedEngine,
        thread: ThreadPoolExecutor,
        deliver: Callable[[list[RequestOutput]], None],
    ) -> None:
        self.engine = engine
        self._thread = thread
        self._deliver = deliver
        self._changes: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = False
        self._running: Future[None] | None = None
        self.step_started: float | None = None  # monotonic start of the step in progress
        self.failed_steps = 0  # consecutive steps that raised
        self.last_step_s = 0.0  # how long the last engine step took, on the engine's thread

    def start(self) -> Future[None]:
        self._running = self._thread.submit(self._run)
        return self._running

    def stop(self) -> None:
        """Ends the loop after the step in progress (blocking: call it from a worker)."""
        self._stopping = True
        self._wake.set()
        if self._running is not None:
            self._running.result()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Runs ``fn`` on the engine thread before its next step."""
        done: Future[T] = Future()

        def change() -> None:
            if done.set_running_or_notify_cancel():
                try:
                    done.set_result(fn())
                except BaseException as exc:
                    done.set_exception(exc)

        self._changes.put(change)
        self._wake.set()
        return done

    def wake(self) -> None:
        """Tells a sleeping loop to look for work again (a bookkeeping call may have made some)."""
        self._wake.set()

    def _run(self) -> None:
        try:
            while not self._stopping:
                # Cleared before looking for work, so a change queued meanwhile wakes it.
                self._wake.clear()
                self._run_changes()
                outputs = self._step()
                if outputs is None:
                    self._wake.wait()
                elif outputs:
                    self._deliver(outputs)
        finally:
            self._run_changes()

    def _run_changes(self) -> None:
        while True:
            try:
                change = self._changes.get_nowait()
            except queue.Empty:
                return
            change()

    def _step(self) -> list[RequestOutput] | None:
        """One engine step's outputs; None when the engine had nothing to do."""
        if not self.engine.has_unfinished_requests():
            return None
        self.step_started = started = time.monotonic()
        try:
            outputs = self.engine.step()
        except Exception:
            # The engine fails the sequences a bad step belongs to; reaching here is a bug.
            # Retrying the same batch forever would hang its clients, so give up on them.
            log.exception("engine step failed")
            return self._after_failure()
        finally:
            self.step_started = None
        self.last_step_s = time.monotonic() - started
        self.failed_steps = 0
        return outputs

    def _after_failure(self) -> list[RequestOutput]:
        self.failed_steps += 1
        if self.failed_steps < MAX_FAILED_STEPS:
            time.sleep(FAILED_STEP_PAUSE_S)
            return []
        self.failed_steps = 0
        with self.engine.lock:
            return self.engine.fail_all("the engine failed to run this request")
