"""The processes of a running stack, as /proc shows them: every child of `crescent up` carries
``CRESCENT_UP_ID`` and its name (``CRESCENT_CHILD_NAME``) in its environment."""

from __future__ import annotations

from pathlib import Path


def processes() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def environ_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with; empty when it is gone or not ours to read."""
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


def marked(up_id: str) -> list[int]:
    """Every process of the stack ``up_id``, its grandchildren too."""
    return [pid for pid in processes() if environ_of(pid).get("CRESCENT_UP_ID") == up_id]


def children_of(launcher_pid: int) -> dict[str, int]:
    """Name -> pid of every service the `crescent up` at ``launcher_pid`` runs now."""
    found: dict[str, int] = {}
    for pid in processes():
        env = environ_of(pid)
        if env.get("CRESCENT_UP_ID") and parent_of(pid) == launcher_pid:
            found[env.get("CRESCENT_CHILD_NAME", str(pid))] = pid
    return found
