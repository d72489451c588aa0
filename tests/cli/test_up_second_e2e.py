"""A second `crescent up` on the data folder of a running stack: refused at once, naming the
first, and the first stack's catalogue, secrets and logs are left byte for byte as they were;
`crescent status` without --url finds the first stack from the folder's lock record."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import stack_env
from tests.e2e.stack import Stack, collect_logs, processes_marked
from tests.support.wait import wait_until

pytestmark = pytest.mark.slow


def hashes(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@contextlib.contextmanager
def frozen(stack: Stack) -> Iterator[None]:
    """Every process of the stack but its launcher paused (SIGSTOP): the catalogue's journal
    is written all the time by the stack itself, so only while it is paused does a change in
    the folder show that someone else made it."""
    pids = processes_marked(stack.up_id)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        # A process stops only once back from the kernel: a write under way has landed.
        wait_until(lambda: all(stopped(pid) for pid in pids), "every process to stop")
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (or gone): its state in /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t", "Z", "X")


def crescent(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crescent", *argv],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_up_on_a_running_stacks_folder_is_refused_and_touches_nothing(
    tmp_path: Path, cache_dir: Path
) -> None:
    # Its own NATS, so that its secrets are in the folder too.
    env = stack_env(cache_dir, "", "tcp") | {"PYTHONIOENCODING": "utf-8"}
    stack = Stack.start(tmp_path, env)
    try:
        with frozen(stack):
            before = hashes(tmp_path)
            second = crescent("up", "--data-dir", str(tmp_path), env=env)
            after = hashes(tmp_path)
        assert {"cachemeta.db", "secrets/cache.secret", "logs/gateway.log"} <= set(before)
        assert after == before
        assert second.returncode == 1, (second.returncode, second.stderr)
        # Refused at once: before its first start-up step (a wall-clock bound would measure
        # the host's load, not the refusal).
        assert "✓" not in second.stdout + second.stderr, second.stdout
        assert f"pid {stack.proc.pid}, http://127.0.0.1:{stack.port}" in second.stderr
        found = crescent("status", env=env | {"CRESCENT_DATA_DIR": str(tmp_path)})
        assert found.returncode == 0, found.stderr
        assert "prefill-0" in found.stdout and "decode-0" in found.stdout
    finally:
        status = stack.stop()
    assert status == 0, collect_logs(tmp_path)
    steps = "".join(stack.output)
    for step in ("model checked", "NATS server", "nodes ready", "gateway ready"):
        assert f"✓ {step} " in steps, steps
