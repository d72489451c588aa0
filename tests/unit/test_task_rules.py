"""Every task the services run is started by ``shared/lifecycle.py``, which names it, logs and
counts its failures and stops it: no other module calls ``create_task`` or ``ensure_future``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("shared", "services", "crescent")
STARTERS = {"create_task", "ensure_future"}
ALLOWED = {"shared/lifecycle.py"}
#: Benchmark drivers run their own load generators, not service tasks.
BENCH = "crescent/bench/"


def _starts(path: Path) -> list[int]:
    """The lines of ``path`` that call a task starter (``asyncio.create_task``,
    ``loop.create_task``, ``group.create_task``, ``ensure_future``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in STARTERS:
                lines.append(node.lineno)
    return lines


def _found() -> dict[str, list[int]]:
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED or rel.startswith(BENCH):
                continue
            lines = _starts(path)
            if lines:
                found[rel] = lines
    return found


def test_only_the_lifecycle_starts_tasks() -> None:
    found = _found()
    assert found == {}, f"tasks started outside shared/lifecycle.py: {found}"


def test_the_check_sees_every_way_of_starting_a_task(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text(
        "import asyncio\n"
        "asyncio.create_task(f())\n"
        "loop.create_task(f())\n"
        "group.create_task(f())\n"
        "from asyncio import ensure_future\n"
        "ensure_future(f())\n"
        "asyncio.gather(f())\n",
        encoding="utf-8",
    )
    assert _starts(source) == [2, 3, 4, 6]
