"""The node's ownership rules, checked on the source: a request's stage changes in one file,
the engine is reached through its host, and roles see only ``NodeContext``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE_CODE = ("shared/node", "services/prefill", "services/decode")
#: Files that only wire parts together may name the engine itself.
WIRING = {"main.py", "runtime.py"}
ENGINE_MODULE = "shared.engine.engine"
ENGINE_INTERNALS = {"runner", "pool", "exchange", "keeps"}
ROLES = (
    "services/prefill/handlers.py",
    "services/decode/handlers.py",
    "services/decode/local.py",
    "shared/node/handoff_driver.py",
)


def _files(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_a_stage_is_assigned_only_by_the_request_table() -> None:
    offenders = []
    for path in _files("shared", "services"):
        for node in ast.walk(_tree(path)):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "stage":
                    offenders.append(f"{_rel(path)}:{node.lineno}")
    assert offenders and all(o.startswith("shared/node/requests.py:") for o in offenders), offenders


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return []


def test_only_the_engine_host_and_wiring_import_the_engine() -> None:
    offenders = []
    for path in _files(*NODE_CODE):
        if path.name == "engine_host.py" or path.name in WIRING:
            continue
        for node in ast.walk(_tree(path)):
            if ENGINE_MODULE in _imported(node):
                offenders.append(_rel(path))
    assert offenders == []


def _reaches_inside_engine(node: ast.AST) -> bool:
    """``<x>.engine.runner`` and the like (or ``engine.runner`` on a bare name)."""
    if not isinstance(node, ast.Attribute) or node.attr not in ENGINE_INTERNALS:
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "engine") or (
        isinstance(owner, ast.Name) and owner.id == "engine"
    )


def test_no_node_code_but_the_host_reaches_inside_the_engine() -> None:
    offenders = [
        f"{_rel(path)}:{node.lineno}"
        for path in _files(*NODE_CODE)
        if path.name != "engine_host.py"
        for node in ast.walk(_tree(path))
        if _reaches_inside_engine(node)
    ]
    assert offenders == []


def _context_members() -> set[str]:
    tree = _tree(ROOT / "shared/node/context.py")
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "NodeContext")
    members = set()
    for item in cls.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members.add(item.target.id)
        elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            members.add(item.name)
    return members


def _node_reads(tree: ast.AST) -> list[tuple[str, int]]:
    """Attributes read of ``self.node`` or of a local ``node`` (bound to it)."""
    reads = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute):
            continue
        owner = n.value
        via_self = (
            isinstance(owner, ast.Attribute)
            and owner.attr == "node"
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
        )
        if via_self or (isinstance(owner, ast.Name) and owner.id == "node"):
            reads.append((n.attr, n.lineno))
    return reads


def test_roles_use_only_what_the_node_context_offers() -> None:
    members = _context_members()
    assert {"requests", "leases", "host", "send", "fail"} <= members
    offenders = [
        f"{role}:{line} node.{name}"
        for role in ROLES
        for name, line in _node_reads(_tree(ROOT / role))
        if name not in members
    ]
    assert offenders == []


#: Files that only wire or translate stay small enough to read at once.
THIN = ("shared/node/runtime.py", "services/scheduler/handlers.py")


def test_the_runtime_and_the_scheduler_adapter_stay_under_200_lines() -> None:
    sizes = {f: len((ROOT / f).read_text(encoding="utf-8").splitlines()) for f in THIN}
    assert all(n < 200 for n in sizes.values()), sizes
