"""The dependency rules of the layout, checked on the source: a violation fails the build."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Heavy libraries each live in one place; anything else must reach them through it.
CONFINED = {
    "torch": ("shared/model/", "shared/engine/", "services/prefill/", "services/decode/"),
    "transformers": ("shared/model/gguf_convert.py",),
    "gguf": ("shared/model/gguf_",),  # the modules that read GGUF files
    "ucxx": ("shared/transfer/ucx.py",),
    "sqlalchemy": ("services/cachemeta/",),
    "alembic": ("services/cachemeta/",),
    # shared/rpc/client.py is the only place outside cachemeta that touches gRPC stubs.
    "grpc": ("shared/rpc/", "services/cachemeta/"),
    "aiobotocore": ("services/tierd/",),
    "fastapi": ("services/gateway/",),
    "fastapi_offline": ("services/gateway/",),
}
FRAMEWORKS = (
    "nats", "fastapi", "fastapi_offline", "grpc", "sqlalchemy", "alembic", "aiobotocore",
    "starlette",
)  # fmt: skip
# Wiring and adapters talk to frameworks; the storage adapters (tables, statements,
# migrations, the S3 client) are the one place a service touches its storage library.
WIRING_FILES = {"main.py", "__main__.py", "api.py", "handlers.py", "servicer.py", "config.py"}
STORAGE_ADAPTERS = {"database.py", "models.py", "repository.py", "s3.py"}
STORAGE_LIBRARIES = ("sqlalchemy", "alembic", "aiobotocore")


def _is_adapter(path: Path, module: str) -> bool:
    if path.name in WIRING_FILES:
        return True
    in_storage = path.name in STORAGE_ADAPTERS or "migrations" in path.parts
    return in_storage and _top(module) in STORAGE_LIBRARIES


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _sources(*folders: str) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py")) if (ROOT / f).exists()]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _top(module: str) -> str:
    return module.split(".")[0]


def test_shared_never_imports_services_or_the_cli() -> None:
    bad = [
        f"{_rel(p)} imports {m}"
        for p in _sources("shared")
        for m in _imports(p)
        if _top(m) in {"services", "crescent"}
    ]
    assert not bad, bad


def test_no_service_imports_another() -> None:
    bad = []
    for path in _sources("services"):
        parts = path.relative_to(ROOT / "services").parts
        if len(parts) < 2:
            continue
        own = parts[0]
        for module in _imports(path):
            pieces = module.split(".")
            if pieces[0] == "services" and len(pieces) > 1 and pieces[1] != own:
                bad.append(f"{_rel(path)} imports {module}")
    assert not bad, bad


def test_heavy_dependencies_stay_in_their_place() -> None:
    bad = []
    for path in _sources("shared", "services", "crescent"):
        rel = _rel(path)
        for module in _imports(path):
            homes = CONFINED.get(_top(module))
            if homes is not None and not rel.startswith(homes):
                bad.append(f"{rel} imports {module}")
    assert not bad, bad


def test_service_cores_import_no_framework() -> None:
    bad = [
        f"{_rel(p)} imports {m}"
        for p in _sources("services")
        for m in _imports(p)
        if _top(m) in FRAMEWORKS and not _is_adapter(p, m)
    ]
    assert not bad, bad


def test_the_rules_see_real_files() -> None:
    # Guards against a refactor that moves code out from under the checks above.
    assert len(_sources("shared")) > 10
    assert "torch" in set().union(*(_imports(p) for p in _sources("shared/model")))
