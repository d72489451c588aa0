"""The scheduler's bounded queue of placements in flight."""

from __future__ import annotations

import time

import pytest

from services.scheduler.admission import MAX_RETRY_S, MIN_RETRY_S, AdmissionGate


def test_requests_beyond_the_bound_are_refused_at_once() -> None:
    gate = AdmissionGate(max_pending=2)
    assert gate.enter(0.0) is None and gate.enter(0.0) is None
    refused = gate.enter(0.0)
    assert refused is not None
    assert (refused.status, refused.cause, refused.retry_after_s) == (429, "queue_full", 1.0)
    assert gate.pending == 2
    gate.leave(0.1)
    assert gate.pending == 1 and gate.enter(0.1) is None


def test_a_resumed_request_always_enters() -> None:
    gate = AdmissionGate(max_pending=1)
    assert gate.enter(0.0) is None
    assert gate.enter(0.0, resumed=True) is None
    assert gate.pending == 2
    assert gate.enter(0.0) is not None


def test_retry_after_follows_the_drain_rate() -> None:
    gate = AdmissionGate(max_pending=10)
    for _ in range(30):
        gate.enter(0.0, resumed=True)
    for i in range(1, 21):  # 20 placements decided in 4 s: 5 a second
        gate.leave(i * 0.2)
    assert gate.drain_rate(4.0) == pytest.approx(20 / 3.8)
    assert gate.drain_rate(5.0) == pytest.approx(20 / 4.8)
    for _ in range(20):
        gate.enter(5.0, resumed=True)
    # 30 pending: this one is the 21st beyond the bound, 21 / (20 / 4.8) s away.
    assert gate.pending == 30
    refused = gate.enter(5.0)
    assert refused is not None and refused.retry_after_s == pytest.approx(21 * 4.8 / 20)


def test_retry_after_is_bounded_and_forgets_old_rates() -> None:
    gate = AdmissionGate(max_pending=1, window=4, horizon_s=10.0)
    gate.enter(0.0)
    gate.leave(0.0)
    gate.enter(0.0)
    assert gate.retry_after_s(0.0) == MIN_RETRY_S  # all at once: drained instantly
    for _ in range(500):
        gate.enter(9.0, resumed=True)
    assert gate.retry_after_s(9.0) == MAX_RETRY_S  # 500 beyond at one in 9 s
    assert gate.drain_rate(10.5) is None  # the last one ended over 10 s ago
    assert gate.retry_after_s(10.5) == MIN_RETRY_S
    for t in range(5):
        gate.leave(20.0 + t)
    assert len(gate._ended) == 4 and gate.drain_rate(24.0) == pytest.approx(4 / 3)


def test_unmatched_leaves_do_not_go_below_zero() -> None:
    gate = AdmissionGate(max_pending=1)
    gate.leave(0.0)
    assert gate.pending == 0 and gate.enter(0.0) is None


def test_a_refusal_costs_microseconds() -> None:
    gate = AdmissionGate(max_pending=256)
    for i in range(256):
        gate.enter(0.0)
        gate.leave(i * 0.01)
        gate.enter(i * 0.01)
    started = time.perf_counter()
    for _ in range(10_000):
        assert gate.enter(3.0) is not None
    per_call = (time.perf_counter() - started) / 10_000
    assert per_call < 50e-6, per_call
