"""A whole Crescent stack started the way a user starts it: `crescent up`, as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.nats import free_port


@dataclass
class Stack:
    """One running `crescent up`. ``up_id`` marks every process it started."""

    proc: subprocess.Popen[str]
    port: int
    data_dir: Path
    up_id: str
    output: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @classmethod
    def start(
        cls,
        data_dir: Path,
        env: dict[str, str],
        timeout_s: float = 300,
        extra_args: Sequence[str] = (),
    ) -> Stack:
        port = free_port()
        env = os.environ | env
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "crescent",
                "up",
                "--port",
                str(port),
                "--data-dir",
                str(data_dir),
                *extra_args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        stack = cls(proc, port, data_dir, "")
        deadline = time.monotonic() + timeout_s
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            stack.output.append(line)
            if line.startswith("Crescent is serving"):
                stack.up_id = stack_marker(proc.pid)
                return stack
        proc.kill()
        logs = "".join(stack.output)
        raise RuntimeError(f"crescent up did not become ready:\n{logs}\n{collect_logs(data_dir)}")

    def stop(self, timeout_s: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)


def stack_marker(launcher_pid: int) -> str:
    """The CRESCENT_UP_ID `crescent up` gave its children: read from any child's environment."""
    for pid in processes():
        env = environ_of(pid)
        if env.get("CRESCENT_UP_ID") and parent_of(pid) == launcher_pid:
            return env["CRESCENT_UP_ID"]
    return uuid.uuid4().hex  # no child found: a marker that matches nothing


def processes() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def parent_of(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def processes_marked(up_id: str) -> list[int]:
    return [pid for pid in processes() if environ_of(pid).get("CRESCENT_UP_ID") == up_id]


def collect_logs(data_dir: Path) -> str:
    parts = []
    for log in sorted((data_dir / "logs").glob("*.log")):
        parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
    return "\n".join(parts)
