"""`crescent up`'s start-up lines (one per completed step, with its time, plain text off a
terminal) and its stop signals (a flag, raised at once only around work that starts nothing)."""

from __future__ import annotations

import io
import os
import signal
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from rich.console import Console

from crescent import up_progress
from crescent.up_progress import StartupProgress, seconds
from crescent.up_stop import Stopped, StopSignals
from tests.support.wait import wait_until


def progress() -> tuple[StartupProgress, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=80, highlight=False)
    return StartupProgress(console), out


def test_each_completed_step_is_one_plain_line_with_its_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The steps' clock, moved by hand: the line must show the step's time, not the host's load.
    now = [100.0]
    monkeypatch.setattr(up_progress, "time", SimpleNamespace(monotonic=lambda: now[0]))
    steps, out = progress()
    with steps.step("NATS server"):
        now[0] += 0.3
    with steps.step("nodes ready"):
        pass
    lines = out.getvalue().splitlines()
    assert lines[0] == "✓ NATS server 0.3 s", lines
    assert lines[1] == "✓ nodes ready 0.0 s"
    assert "\x1b" not in out.getvalue()  # no terminal codes off a terminal


def test_a_step_that_fails_prints_no_tick() -> None:
    steps, out = progress()
    with pytest.raises(RuntimeError), steps.step("gateway ready"):
        raise RuntimeError("no")
    assert out.getvalue() == ""


def test_times_read_as_people_say_them() -> None:
    assert (seconds(0.42), seconds(9.94), seconds(25.4)) == ("0.4 s", "9.9 s", "25 s")


@pytest.fixture
def signals() -> Iterator[StopSignals]:
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    yield StopSignals()
    signal.signal(signal.SIGINT, saved[0])
    signal.signal(signal.SIGTERM, saved[1])


def test_a_signal_outside_interruptible_work_only_sets_the_flag(signals: StopSignals) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    wait_until(lambda: signals.requested, "the handler to run")
    assert signals.flag == [True]
    with pytest.raises(Stopped):
        signals.check()


def test_a_signal_inside_interruptible_work_stops_it_at_once(signals: StopSignals) -> None:
    started = time.monotonic()
    with pytest.raises(Stopped), signals.interruptible():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # a long model conversion, say: the work the signal must cut short
    assert time.monotonic() - started < 2
    # Afterwards, a signal is a flag again.
    os.kill(os.getpid(), signal.SIGINT)
    wait_until(lambda: signals.requested, "the handler to run again")
