"""`crescent up` refuses at once, before it starts or writes anything, when its gateway port is
taken or another stack runs from its data folder; a stop during start-up says "stopped"."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crescent.procfs import environ_of, processes
from crescent.up_lock import LOCK_NAME, DataLock, read_record

#: Variables of an outer stack or test run that would change what `crescent up` starts.
_OUTER = ("CRESCENT_NATS_URL", "CRESCENT_CACHEMETA_URL", "CRESCENT_DATA_DIR", "CRESCENT_MODEL")


def up(data_dir: Path, port: int, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in _OUTER} | {"PYTHONIOENCODING": "utf-8"}
    argv = [sys.executable, "-m", "crescent", "up", "--port", str(port)]
    argv += ["--data-dir", str(data_dir), *extra]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def refused(data_dir: Path, port: int) -> tuple[int, str, float]:
    """Exit status, stderr and seconds of a `crescent up` expected to give up at once."""
    started = time.monotonic()
    proc = up(data_dir, port)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err, time.monotonic() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def listener() -> Iterator[int]:
    """A port this process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def hashes(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def stack_folder(folder: Path) -> None:
    """What a running stack keeps in its data folder: secrets, the catalogue, logs."""
    (folder / "secrets").mkdir(parents=True)
    (folder / "secrets" / "cache.secret").write_text("a-secret\n")
    (folder / "secrets" / "cachemeta.token").write_text("a-token\n")
    (folder / "cachemeta.db").write_bytes(b"SQLite format 3\0" + bytes(100))
    (folder / "logs").mkdir()
    for name in ("gateway", "prefill-0", "nats"):
        (folder / "logs" / f"{name}.log").write_text(f"{name} started\n")
    (folder / "stack.json").write_text(json.dumps({"api": "http://127.0.0.1:1/v1"}))


def test_a_taken_port_is_refused_at_once_naming_its_holder(tmp_path: Path, listener: int) -> None:
    status, err, seconds = refused(tmp_path, listener)
    assert status == 1 and seconds < 2, (status, seconds, err)
    assert f"port {listener} is taken by pid {os.getpid()}" in err, err
    # Nothing started: the lock file is all there is, its record emptied, its lock free.
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_NAME]
    assert read_record(tmp_path) is None
    DataLock.acquire(tmp_path).release()


def test_a_second_up_on_a_locked_folder_is_refused_and_writes_nothing(
    tmp_path: Path, listener: int
) -> None:
    stack_folder(tmp_path)
    lock = DataLock.acquire(tmp_path)
    try:
        lock.write_record("http://127.0.0.1:8123")
        before = hashes(tmp_path)
        # The port is taken too: the folder's stack is what gets named, it is checked first.
        status, err, seconds = refused(tmp_path, listener)
        assert hashes(tmp_path) == before
    finally:
        lock.release()
    assert status == 1 and seconds < 3, (status, seconds, err)
    assert f"pid {os.getpid()}, http://127.0.0.1:8123" in err and str(tmp_path) in err, err
    assert "port" not in err


def test_a_lock_taken_before_its_record_is_written_still_names_its_holder(
    tmp_path: Path,
) -> None:
    lock = DataLock.acquire(tmp_path)
    try:
        status, err, _ = refused(tmp_path, free_port())
    finally:
        lock.release()
    assert status == 1 and f"a stack (pid {os.getpid()}) already runs from" in err, err


def fake_model(folder: Path) -> Path:
    """A model folder whose check passes at once (nodes could not load it)."""
    folder.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 128,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def processes_of(folder: Path) -> list[int]:
    """The processes whose command line or environment names ``folder``."""
    return [
        pid
        for pid in processes()
        if str(folder) in _cmdline(pid) or any(str(folder) in v for v in environ_of(pid).values())
    ]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_during_start_up_says_stopped(tmp_path: Path, sig: signal.Signals) -> None:
    data = tmp_path / "data"
    proc = up(data, free_port(), "--model", str(fake_model(tmp_path / "model")))
    assert proc.stderr is not None
    steps = []
    for line in proc.stderr:
        steps.append(line)
        if "NATS server" in line:  # NATS runs; cachemeta is starting
            break
    assert steps and steps[-1].startswith("✓ NATS server "), steps
    assert steps[0].startswith("✓ model checked "), steps
    assert len(processes_of(data)) >= 2  # `crescent up`, NATS (cachemeta starting)
    proc.send_signal(sig)
    started = time.monotonic()
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, rest
    assert time.monotonic() - started < 30
    assert rest.strip().endswith("stopped"), rest
    assert processes_of(data) == []  # NATS and cachemeta were stopped
    assert "never reported ready" not in rest and "Traceback" not in rest
    assert read_record(data) is None
    DataLock.acquire(data).release()
