"""Secret files of a deployment: readable by their owner only, written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from shared.secrets import read_secret_file

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def new_secret() -> str:
    """256 random bits, URL-safe (so it fits a config file, an env variable or a header)."""
    return secrets.token_urlsafe(32)


def private_dir(path: Path) -> Path:
    """``path`` as a folder only its owner can enter."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    os.chmod(path, PRIVATE_DIR)
    return path


def _write_temp(path: Path, text: str) -> Path:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()
    # Created with mode 0600 from the start: the text is never readable by others, not even
    # for a moment before a chmod.
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    return temp


def write_private(path: Path, text: str) -> Path:
    """Replaces ``path`` with ``text``, mode 0600; a reader sees the old file or the new one."""
    os.replace(_write_temp(path, text), path)
    return path


def create_private(path: Path, text: str) -> bool:
    """Writes ``text`` to ``path`` (mode 0600) only if no file is there; True if this call
    wrote it. Of two processes creating it at once, one wins and the other keeps its file:
    the file is linked into place, never replaced."""
    temp = _write_temp(path, text)
    try:
        os.link(temp, path)
    except FileExistsError:
        return False
    finally:
        temp.unlink()
    return True


def persistent_secret(path: Path) -> str:
    """The secret kept in ``path``, created on first use. Two processes creating it at once
    both end up with the same one."""
    if not path.exists():
        create_private(path, new_secret() + "\n")
    os.chmod(path, PRIVATE_FILE)
    return read_secret_file(path)
