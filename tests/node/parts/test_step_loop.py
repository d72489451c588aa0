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


@pytest.fixture
def thread() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-engine")
    yield pool
    pool.shutdown(wait=True)


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


def gated_steps(engine: LLMEngine, journal: list[str]) -> threading.Event:
    """Makes the engine's first step wait for the returned event; every step is journaled."""
    gate, step = threading.Event(), engine.step

    def gated() -> list[RequestOutput]:
        journal.append("step")
        if journal.count("step") == 1:
            gate.wait(30)
        return step()

    engine.step = gated  # type: ignore[method-assign]
    return gate


def in_first_step(
    engine: LLMEngine, thread: ThreadPoolExecutor, journal: list[str]
) -> tuple[StepLoop, threading.Event, Delivered]:
    """A started loop stepping request "r", its first step held until the returned gate
    is set."""
    delivered = Delivered()
    gate = gated_steps(engine, journal)
    loop = StepLoop(engine, thread, delivered)
    loop.start()
    loop.submit(partial(engine.add_request, "r", prompt(1), PLAIN)).result(10)
    wait_until(lambda: loop.step_started is not None, "the first step to start")
    return loop, gate, delivered


def test_changes_queued_during_a_step_run_before_the_next(
    make_engine: EngineFactory, thread: ThreadPoolExecutor
) -> None:
    engine, journal = make_engine(), list[str]()
    loop, gate, delivered = in_first_step(engine, thread, journal)
    try:
        done = [loop.submit(partial(journal.append, f"change{i}")) for i in range(3)]
        gate.set()
        for future in done:
            future.result(10)
        wait_until(lambda: delivered.finished("r") is not None, "the request to finish")
    finally:
        gate.set()
        loop.stop()
    assert journal[:5] == ["step", "change0", "change1", "change2", "step"]


def test_steps_that_keep_raising_fail_every_request(
    make_engine: EngineFactory, thread: ThreadPoolExecutor
) -> None:
    engine, delivered = make_engine(), Delivered()
    raised = [0]

    def broken() -> list[RequestOutput]:
        raised[0] += 1
        raise RuntimeError("a bug in the step")

    engine.step = broken  # type: ignore[method-assign]
    loop = StepLoop(engine, thread, delivered)
    loop.start()
    try:
        for rid in ("a", "b"):
            loop.submit(partial(engine.add_request, rid, prompt(2), PLAIN)).result(10)
        wait_until(lambda: delivered.finished("b") is not None, "the requests to fail")
        # The loop is idle once they failed: it stepped no more than the failures allowed.
        loop.submit(lambda: None).result(10)
    finally:
        loop.stop()
    for rid in ("a", "b"):
        failed = delivered.finished(rid)
        assert failed is not None and failed.finish_reason is FinishReason.ERROR and failed.error
    assert raised[0] == MAX_FAILED_STEPS
    assert not engine.has_unfinished_requests()


def test_stop_runs_the_changes_still_queued(
    make_engine: EngineFactory, thread: ThreadPoolExecutor
) -> None:
    engine, journal = make_engine(), list[str]()
    loop, gate, _ = in_first_step(engine, thread, journal)
    stopper = threading.Thread(target=loop.stop)
    try:

        def late_change() -> int:
            journal.append("queued")
            return 7

        queued = loop.submit(late_change)
        stopper.start()
        wait_until(lambda: loop._stopping, "stop to be asked")
        gate.set()
        stopper.join(30)
    finally:
        gate.set()
        loop.stop()
    assert not stopper.is_alive()
    assert queued.result(0) == 7
    assert journal == ["step", "queued"]  # no step after the one stop waited for
