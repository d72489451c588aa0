"""The host's core ledger: model processes sharing cores take their share step by step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from shared.engine import host_cores
from shared.engine.host_cores import HostCores

CORES = {0, 1}


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "cores"


def live_pid() -> int:
    """A live process other than this one (its slot must count as taken)."""
    return os.getppid()


def test_alone_a_process_takes_every_core_it_may_use(ledger: Path) -> None:
    cores = HostCores(ledger, CORES, max_threads=2)
    assert cores.begin_step() == 2
    cores.end_step()
    assert HostCores(ledger, CORES, max_threads=1, pid=live_pid()).begin_step() == 1


def test_two_processes_computing_on_the_same_cores_take_one_each(ledger: Path) -> None:
    prefill = HostCores(ledger, CORES, 2)
    decode = HostCores(ledger, CORES, 2, pid=live_pid())
    assert prefill.begin_step() == 2
    assert decode.begin_step() == 1  # the prefill is computing
    prefill.end_step()
    assert prefill.begin_step() == 1  # the decode node is computing
    prefill.end_step()
    decode.end_step()


def test_a_process_that_just_stepped_still_counts_then_stops_counting(
    ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ledger's own clock, moved by hand: a busy host cannot age the step before we look.
    now = [1000.0]
    monkeypatch.setattr(host_cores, "time", SimpleNamespace(monotonic=lambda: now[0]))
    decode = HostCores(ledger, CORES, 2)
    prefill = HostCores(ledger, CORES, 2, pid=live_pid())
    decode.begin_step()
    decode.end_step()
    now[0] += host_cores.RECENT_S / 2
    assert prefill.begin_step() == 1  # between two decode steps
    prefill.end_step()
    now[0] += host_cores.RECENT_S
    assert prefill.begin_step() == 2
    prefill.end_step()


def test_a_process_left_with_nothing_to_compute_stops_counting_at_once(ledger: Path) -> None:
    """The decode node's last step of a stream ends just before the next prompt's prefill
    begins: that prefill, one step of a second or more, must get every core."""
    decode = HostCores(ledger, CORES, 2)
    prefill = HostCores(ledger, CORES, 2, pid=live_pid())
    decode.begin_step()
    decode.end_step()
    decode.idle()
    assert prefill.begin_step() == 2
    prefill.end_step()
    prefill.idle()
    decode.begin_step()
    decode.idle()  # never hides a step in progress
    assert prefill.begin_step() == 1


def test_processes_on_other_cores_do_not_count(ledger: Path) -> None:
    left = HostCores(ledger, {0, 1}, 2)
    right = HostCores(ledger, {2, 3}, 2, pid=live_pid())
    assert left.begin_step() == 2
    assert right.begin_step() == 2


def test_a_dead_processes_mark_is_ignored_and_its_slot_reused(ledger: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = HostCores(ledger, CORES, 2, pid=gone.pid)
    dead.begin_step()  # it died computing
    alive = HostCores(ledger, CORES, 2)
    assert alive.begin_step() == 2
    assert alive._slot == dead._slot


def test_closing_frees_the_slot(ledger: Path) -> None:
    first = HostCores(ledger, CORES, 2, pid=live_pid())
    first.begin_step()
    first.close()
    assert HostCores(ledger, CORES, 2).begin_step() == 2
