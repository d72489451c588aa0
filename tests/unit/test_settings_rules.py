"""The configuration rules, checked on the source: the environment is read only in settings
modules, and every settings class derives from the one base, ``ServiceSettings``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("shared", "services", "crescent")
BASE_MODULE = "shared/service_settings.py"
#: What ``os`` offers to read or change the environment.
ENV_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def is_settings_module(path: Path) -> bool:
    return path.name in ("settings.py", "config.py") or path.name.endswith("_settings.py")


def sources() -> Iterator[tuple[str, ast.Module]]:
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            yield relative, ast.parse(path.read_text(encoding="utf-8"), filename=relative)


def environment_uses(tree: ast.Module) -> list[str]:
    """Each place ``tree`` reaches the environment through ``os``, as ``line: what``."""
    modules = {"os"} | {
        alias.asname
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "os" and alias.asname
    }
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [
                (node.lineno, f"from os import {a.name}") for a in node.names if a.name in ENV_NAMES
            ]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ENV_NAMES
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def base_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.add(base.id)
        elif isinstance(base, ast.Attribute):
            names.add(base.attr)
    return names


def test_the_environment_is_read_only_in_settings_modules() -> None:
    stray = [
        f"{path}:{use}"
        for path, tree in sources()
        if not is_settings_module(Path(path))
        for use in environment_uses(tree)
    ]
    assert stray == [], "read the environment in a settings class and pass the value in"


def test_only_the_common_base_derives_from_base_settings_itself() -> None:
    # Every other settings class then reaches BaseSettings through ServiceSettings.
    direct = [
        f"{path}:{node.lineno} {node.name}"
        for path, tree in sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and "BaseSettings" in base_names(node)
    ]
    assert direct == [f"{BASE_MODULE}:{_base_line()} ServiceSettings"]


def test_every_settings_class_of_the_reference_is_a_service_settings() -> None:
    from crescent.config_reference import _sections
    from shared.service_settings import ServiceSettings

    classes = [settings for _, settings, _ in _sections()]
    assert len(classes) >= 10
    assert [c.__name__ for c in classes if not issubclass(c, ServiceSettings)] == []


def test_the_rules_see_what_they_forbid() -> None:
    tree = ast.parse(
        "import os\nimport os as system\nfrom os import getenv, path\n"
        "a = os.environ['X']\nb = system.getenv('Y')\nos.path.join('a')\n"
        "class A(BaseSettings): pass\nclass B(pydantic_settings.BaseSettings): pass\n"
    )
    assert environment_uses(tree) == [
        "3: from os import getenv",
        "4: os.environ",
        "5: system.getenv",
    ]
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    assert [base_names(c) for c in classes] == [{"BaseSettings"}, {"BaseSettings"}]
    assert is_settings_module(Path("a/ucx_settings.py")) and is_settings_module(Path("config.py"))
    assert not is_settings_module(Path("a/settings_view.py"))


def _base_line() -> int:
    tree = ast.parse((ROOT / BASE_MODULE).read_text(encoding="utf-8"))
    return next(
        n.lineno for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServiceSettings"
    )
