"""``StepLoop`` on its own, around the tiny engine: queued changes run before the next step,
steps that keep raising fail the engine's requests instead of retrying forever, and stop
runs the changes still queued."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from shared.engine.engine import LLMEngine
from shared.engine.types import FinishReason, RequestOutput
from shared.node.step_loop import MAX_FAILED_STEPS, StepLoop
from tests.engine.conftest import EngineFactory
from tests.node.parts.rig import PLAIN, prompt
from tests.support.wait import wait_until


class Delivered:
    """Owns what the loop handed over, under a lock: it is appended on the engine thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outputs: list[RequestOutput] = []

    def __call__(self, outputs: list[RequestOutput]) -> None:
        with self.lock:
            self.outputs.extend(outputs)

    def finished(self, request_id: str) -> RequestOutput | None:
        with self.lock:
            return next(
                (o for o in self.outputs if o.request_id == request_id and o.finished), None
            )


class Loops:
    """Owns the engine thread of a test, the gate its first step may wait on, and the loops
    it started; ``close`` opens the gate and stops them, so a broken loop fails its test
    instead of hanging the run."""

    def __init__(self) -> None:
        self.thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-engine")
        self.gate = threading.Event()
        self.started: list[StepLoop] = []

    def start(self, engine: LLMEngine, delivered: Delivered) -> StepLoop:
        loop = StepLoop(engine, self.thread, delivered)
        self.started.append(loop)
        loop.start()
        return loop

    def in_first_step(self, engine: LLMEngine, journal: list[str]) -> tuple[StepLoop, Delivered]:
        """A started loop stepping request "r", its first step held until ``gate`` is set;
        every step is journaled."""
        step = engine.step

        def gated() -> list[RequestOutput]:
            journal.append("step")
            if journal.count("step") == 1:
                self.gate.wait(30)
            return step()

        engine.step = gated  # type: ignore[method-assign]
        delivered = Delivered()
        loop = self.start(engine, delivered)
        loop.submit(partial(engine.add_request, "r", prompt(1), PLAIN)).result(10)
        wait_until(lambda: loop.step_started is not None, "the first step to start")
        return loop, delivered

    def close(self) -> None:
        self.gate.set()
        for loop in self.started:
            loop.wake()
            loop.stop()
        self.thread.shutdown(wait=True)


@pytest.fixture
def loops() -> Iterator[Loops]:
    owner = Loops()
    yield owner
    owner.close()


def test_changes_queued_during_a_step_run_before_the_next(
    make_engine: EngineFactory, loops: Loops
) -> None:
    engine, journal = make_engine(), list[str]()
    loop, delivered = loops.in_first_step(engine, journal)
    done = [loop.submit(partial(journal.append, f"change{i}")) for i in range(3)]
    loops.gate.set()
    for future in done:
        future.result(10)
    wait_until(lambda: delivered.finished("r") is not None, "the request to finish")
    assert journal[:5] == ["step", "change0", "change1", "change2", "step"]


def test_steps_that_keep_raising_fail_every_request(
    make_engine: EngineFactory, loops: Loops
) -> None:
    engine, delivered = make_engine(), Delivered()
    raised = [0]

    def broken() -> list[RequestOutput]:
        raised[0] += 1
        raise RuntimeError("a bug in the step")

    engine.step = broken  # type: ignore[method-assign]
    loop = loops.start(engine, delivered)
    for rid in ("a", "b"):
        loop.submit(partial(engine.add_request, rid, prompt(2), PLAIN)).result(10)
    wait_until(lambda: delivered.finished("b") is not None, "the requests to fail")
    # The loop is idle once they failed: it stepped no more than the failures allowed.
    loop.submit(lambda: None).result(10)
    for rid in ("a", "b"):
        failed = delivered.finished(rid)
        assert failed is not None and failed.finish_reason is FinishReason.ERROR and failed.error
    assert raised[0] == MAX_FAILED_STEPS
    assert not engine.has_unfinished_requests()


def test_stop_runs_the_changes_still_queued(make_engine: EngineFactory, loops: Loops) -> None:
    engine, journal = make_engine(), list[str]()
    loop, _ = loops.in_first_step(engine, journal)

    def late_change() -> int:
        journal.append("queued")
        return 7

    queued = loop.submit(late_change)
    stopper = threading.Thread(target=loop.stop)
    stopper.start()
    wait_until(lambda: loop._stopping, "stop to be asked")
    loops.gate.set()
    stopper.join(30)
    assert not stopper.is_alive()
    assert queued.result(0) == 7
    assert journal == ["step", "queued"]  # no step after the one stop waited for
