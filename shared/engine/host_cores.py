"""How many threads a model process computes a step with, when others share its cores.

`crescent up` runs a prefill and a decode node on the same machine. Each sizes its thread
team to every core it may use, and when both compute at once, four threads fight over two
cores: every parallel region of a prefill, and every phase of a decode step, then waits for
a thread that lost its core, and the two together get far less done than either alone.

So model processes on a host keep a small ledger in shared memory: each marks when it is
computing, and before a step counts the others computing on cores it shares, and takes its
share of the cores for that step (at least one thread, at most its configured count). The
share is fixed for the whole step, and a prefill step can last a second: so a process whose
step left it with nothing more to compute says so at once, instead of counting as busy for
``RECENT_S`` more and halving the share of a long step that starts just then.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import time
from pathlib import Path

#: Slots in the ledger: one per model process on the host.
SLOTS = 64
#: A process counts as computing this long after its last step ended: steps come back to back
#: while it has work, with gaps of a millisecond or so between them.
RECENT_S = 0.05
#: A mark older than this is from a process that died mid-step.
STALE_S = 120.0
#: What a slot's ``state`` says: no work, a step in progress, or more steps to come.
IDLE, COMPUTING, BETWEEN_STEPS = 0, 1, 2
# pid, state, its cores as a bit mask, when its last step began and ended
_SLOT = struct.Struct("<iiQdd")


def default_ledger_path() -> Path:
    """One ledger per user and machine, in memory."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
    return base / f"crescent-cores-{os.getuid()}"


class HostCores:
    """Owns this process's slot in the host's core ledger.

    Invariant: a slot is held by at most one live process; slots of processes that are gone,
    or marks older than ``STALE_S``, count as idle.
    """

    def __init__(
        self, path: Path, cores: set[int], max_threads: int, pid: int | None = None
    ) -> None:
        self.max_threads = max(1, max_threads)
        self._cores = cores
        self._mask = sum(1 << c for c in cores if c < 64)
        self._pid = os.getpid() if pid is None else pid
        self._file = path.open("a+b")
        os.chmod(path, 0o600)
        if os.fstat(self._file.fileno()).st_size < SLOTS * _SLOT.size:
            self._file.truncate(SLOTS * _SLOT.size)
        self._map = mmap.mmap(self._file.fileno(), SLOTS * _SLOT.size)
        self._slot = self._claim()

    def begin_step(self) -> int:
        """Marks this process computing; returns how many threads its step should use."""
        now = time.monotonic()
        self._write(COMPUTING, now, self._read(self._slot)[4])
        busy = 1 + sum(1 for i in range(SLOTS) if i != self._slot and self._competes(i, now))
        return max(1, min(self.max_threads, len(self._cores) // busy))

    def end_step(self) -> None:
        _, _, _, began, _ = self._read(self._slot)
        self._write(BETWEEN_STEPS, began, time.monotonic())

    def idle(self) -> None:
        """Marks a process whose last step left it nothing to compute."""
        _, state, _, began, ended = self._read(self._slot)
        if state == BETWEEN_STEPS:
            self._write(IDLE, began, ended)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            _SLOT.pack_into(self._map, self._slot * _SLOT.size, 0, 0, 0, 0.0, 0.0)
            self._map.close()
        self._file.close()

    def _competes(self, slot: int, now: float) -> bool:
        pid, state, mask, began, ended = self._read(slot)
        if pid == 0 or not mask & self._mask:
            return False
        if state == COMPUTING:
            return now - began < STALE_S and _alive(pid)
        return state == BETWEEN_STEPS and now - ended < RECENT_S

    def _claim(self) -> int:
        fcntl.flock(self._file.fileno(), fcntl.LOCK_EX)
        try:
            for i in range(SLOTS):
                pid = self._read(i)[0]
                if pid == 0 or pid == self._pid or not _alive(pid):
                    _SLOT.pack_into(self._map, i * _SLOT.size, self._pid, 0, self._mask, 0.0, 0.0)
                    return i
        finally:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
        raise RuntimeError(f"all {SLOTS} slots of the host's core ledger are taken")

    def _read(self, slot: int) -> tuple[int, int, int, float, float]:
        pid, state, mask, began, ended = _SLOT.unpack_from(self._map, slot * _SLOT.size)
        return pid, state, mask, began, ended

    def _write(self, state: int, began: float, ended: float) -> None:
        _SLOT.pack_into(
            self._map, self._slot * _SLOT.size, self._pid, state, self._mask, began, ended
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
