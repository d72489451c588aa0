"""Child processes that die with their parent and stop in a chosen order."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child before exec: if the launcher is killed outright, the kernel sends the
    # child SIGTERM, so no service outlives `crescent up`.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(slots=True)
class Child:
    """One running service; its output goes to ``log_path``."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def running(self) -> bool:
        return self.proc.poll() is None


def spawn(name: str, argv: Sequence[str], env: dict[str, str], log_dir: Path) -> Child:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # our signals, in our order; not the terminal's Ctrl-C
            preexec_fn=_die_with_parent,
        )
    return Child(name, proc, log_path)


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
