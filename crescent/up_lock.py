"""The lock on a `crescent up` data folder: one stack per folder, for the stack's whole life.

``<data dir>/crescent.lock`` is held with ``flock`` while the stack runs (the kernel drops it
when the process ends, however it ends) and holds a small JSON record of that stack: its pid,
the URL of its API and when it started. The record is written only once the lock is taken,
and emptied when the stack stops, so a record names a stack that runs or was killed outright.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from crescent.cli_settings import CliSettings

LOCK_NAME = "crescent.lock"


def default_data_dir() -> Path:
    """Where `crescent up` keeps its logs, catalogue and secrets unless told otherwise."""
    return CliSettings().up_folder()


@dataclass(frozen=True, slots=True)
class StackRecord:
    """What a running stack says of itself in its folder's lock file."""

    pid: int
    url: str
    started: str


class FolderBusy(Exception):
    """Another `crescent up` holds the lock of ``folder``; ``record`` is what it wrote there
    (None when it has not written it yet) and ``pid`` the holder as the kernel names it."""

    def __init__(self, folder: Path, record: StackRecord | None, pid: int | None) -> None:
        self.folder, self.record, self.pid = folder, record, pid
        holder = record.pid if record is not None else pid
        who = f"pid {holder}" if holder is not None else "another process"
        where = f", {record.url}" if record is not None else ""
        super().__init__(
            f"a stack ({who}{where}) already runs from {folder}; stop it first "
            "or pass another --data-dir"
        )


class DataLock:
    """Owns the open lock file of one data folder: the lock lasts as long as it stays open."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, folder: Path) -> DataLock:
        """The folder's lock, or ``FolderBusy`` at once; creates nothing in the folder but the
        lock file itself."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolderBusy(folder, read_record(folder), holder_pid(path)) from None
        return cls(path, fd)

    def write_record(self, url: str) -> None:
        """Says who holds the lock: this process, serving ``url``."""
        started = datetime.now(UTC).isoformat(timespec="seconds")
        record = {"pid": os.getpid(), "url": url, "started": started}
        self._rewrite(json.dumps(record) + "\n")

    def release(self) -> None:
        """Empties the record and lets the lock go; a second call does nothing."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self._rewrite("")
        os.close(self._fd)
        self._fd = None

    def _rewrite(self, text: str) -> None:
        assert self._fd is not None, "the lock was released"
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode(), 0)


def read_record(folder: Path) -> StackRecord | None:
    """The record in ``folder``'s lock file; None when there is none (or half of one)."""
    try:
        raw = json.loads((folder / LOCK_NAME).read_text())
        return StackRecord(int(raw["pid"]), str(raw["url"]), str(raw.get("started", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running_stack(folder: Path) -> StackRecord | None:
    """The stack that runs from ``folder`` now, from its record; None when none does."""
    record = read_record(folder)
    if record is None or not Path(f"/proc/{record.pid}").exists():
        return None
    return record


def holder_pid(path: Path) -> int | None:
    """The pid holding a ``flock`` on ``path``, as ``/proc/locks`` lists it; None if none."""
    try:
        stat = path.stat()
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    for line in locks:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 8964 fe:00:2146322 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == device:
            return int(fields[4]) if fields[4].isdigit() and fields[4] != "0" else None
    return None
