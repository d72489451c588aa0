"""Child processes that die with their parent and stop in a chosen order."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child before exec: if the launcher is killed outright, the kernel sends the
    # child SIGTERM, so no service outlives `crescent up`.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _lower_priority(nice: int) -> None:
    # Runs in the child before exec. Each child has its own session, and where the kernel
    # groups tasks by session (autogroup), a task's nice value only weighs inside its group:
    # the group's own niceness is what other services compete with. A negative value needs
    # the privilege to raise priority; without it the service runs at the default.
    with contextlib.suppress(OSError):
        os.nice(nice)
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
        group.write(str(nice))


@dataclass(slots=True)
class Child:
    """One running service; its output goes to ``log_path``. ``restarts`` holds the times it
    was started again after it exited."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    restarts: list[float] = field(default_factory=list)
    nice: int = 0

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def restart(self) -> None:
        """Starts the same command again, with the same environment and log."""
        self.proc = _popen(self.argv, self.env, self.log_path, self.nice)
        self.restarts.append(time.monotonic())

    def restarts_within(self, seconds: float) -> int:
        now = time.monotonic()
        return sum(1 for t in self.restarts if now - t <= seconds)


def spawn(
    name: str, argv: Sequence[str], env: dict[str, str], log_dir: Path, nice: int = 0
) -> Child:
    """Starts a service; ``nice`` lowers its CPU priority (and that of every thread it makes)."""
    log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    # The name lets operators (and fault tests) tell the stack's processes apart.
    env = env | {"CRESCENT_CHILD_NAME": name}
    proc = _popen(list(argv), env, log_path, nice)
    return Child(name, proc, log_path, list(argv), env, nice=nice)


def _popen(
    argv: list[str], env: dict[str, str], log_path: Path, nice: int
) -> subprocess.Popen[bytes]:
    def prepare() -> None:
        _die_with_parent()
        if nice:
            _lower_priority(nice)

    # Logs may hold what users sent (CRESCENT_LOG_PROMPTS): only the stack's user reads them.
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    with open(fd, "ab") as log:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # our signals, in our order; not the terminal's Ctrl-C
            preexec_fn=prepare,
        )


def stop_all(children: Sequence[Child], grace_s: float = 15.0) -> None:
    """SIGTERM to each (in the given order, waiting for each), then SIGKILL what is left."""
    for child in children:
        if child.running:
            with contextlib.suppress(ProcessLookupError):
                child.proc.send_signal(signal.SIGTERM)
            _wait(child, grace_s)
    for child in children:
        if child.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, signal.SIGKILL)
            child.proc.wait()


def _wait(child: Child, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while child.running and time.monotonic() < deadline:
        time.sleep(0.05)


#: A service that exits this often within ``RESTART_WINDOW_S`` is not started again: the
#: stack stops instead, since something is wrong that a restart does not cure.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def supervise(children: Sequence[Child], stop: list[bool], restart: bool = True) -> int:
    """Watches the children until ``stop[0]``: one that exits is started again (``restart``)
    unless it keeps exiting; returns the launcher's exit status (1: a child could not be
    kept running)."""
    while not stop[0]:
        for child in children:
            if child.running:
                continue
            status = child.proc.returncode
            if not restart or child.restarts_within(RESTART_WINDOW_S) >= MAX_RESTARTS:
                sys.stderr.write(
                    f"crescent up: {child.name} exited with status {status}; see {child.log_path}\n"
                )
                return 1
            sys.stderr.write(f"crescent up: {child.name} exited with status {status}; restarting\n")
            sys.stderr.flush()
            child.restart()
        time.sleep(0.2)
    print("crescent up: stopping")
    return 0
