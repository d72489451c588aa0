"""`crescent status` without --url: the stack running from the default data folder, found by
the record in the folder's lock file; a clear hint when no stack runs from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from crescent.cli import main
from crescent.up_lock import LOCK_NAME, DataLock


@pytest.fixture
def default_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "up"
    monkeypatch.setenv("CRESCENT_DATA_DIR", str(folder))
    monkeypatch.setenv("COLUMNS", "160")
    return folder


def test_status_finds_the_running_stack_of_the_default_folder(
    gateway: str, default_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A stale stack.json elsewhere in the folder must not win over the lock's record.
    default_folder.mkdir()
    (default_folder / "stack.json").write_text(json.dumps({"api": "http://127.0.0.1:9/v1"}))
    lock = DataLock.acquire(default_folder)
    try:
        lock.write_record(gateway)
        assert main(["status"]) == 0
    finally:
        lock.release()
    assert "prefill-0" in capsys.readouterr().out


def test_no_running_stack_gets_a_hint_not_a_refused_connection(
    default_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"crescent status: no stack found from {default_folder}; "
        "start one with `crescent up` or pass --url\n"
    )


def test_a_stopped_stacks_folder_gets_the_hint_too(
    gateway: str, default_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Stopped cleanly: the record is emptied, stack.json stays behind.
    lock = DataLock.acquire(default_folder)
    lock.write_record(gateway)
    (default_folder / "stack.json").write_text(json.dumps({"api": f"{gateway}/v1"}))
    lock.release()
    assert main(["status"]) == 1
    assert "no stack found from" in capsys.readouterr().err
    # Killed outright: the record names a process that is gone.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = {"pid": gone.pid, "url": gateway, "started": "2026-01-01T00:00:00+00:00"}
    (default_folder / LOCK_NAME).write_text(json.dumps(record))
    assert main(["status"]) == 1
    assert "no stack found from" in capsys.readouterr().err
