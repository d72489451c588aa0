"""The tokenizer's worker process ends with the gateway that started it, even when the gateway
is killed with SIGKILL and never shuts its pool down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from shared.model.files import ModelFiles
from tests.support.wait import wait_until

GATEWAY = """
import sys
from pathlib import Path
from services.gateway.encode_pool import PooledTokenizer

tokenizer = PooledTokenizer.load(Path(sys.argv[1]), min_chars=1)
tokenizer.encode("hello")  # the worker is up and has answered
print(*tokenizer._pool._processes, flush=True)
sys.stdin.read()
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waits for its parent's reaper only
        return stat.read().split(") ")[1][0] != "Z"


def test_the_worker_exits_when_its_gateway_is_killed(model_files: ModelFiles) -> None:
    gateway = subprocess.Popen(
        [sys.executable, "-c", GATEWAY, str(model_files.path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert gateway.stdout is not None
    workers = [int(pid) for pid in gateway.stdout.readline().split()]
    assert workers and all(alive(pid) for pid in workers)
    gateway.send_signal(signal.SIGKILL)
    gateway.wait()
    wait_until(lambda: not any(alive(pid) for pid in workers), "the orphaned workers to exit")
